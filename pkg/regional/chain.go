package regional

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// configLive is the optional config and its etcd revision read together
// (configstore.Watcher has it). A source without it runs revision 0.
type configLive interface {
	Live() (*config.Config, int64)
}

// live is the source's config and its revision.
func live(src ConfigSource) (*config.Config, int64) {
	if l, ok := src.(configLive); ok {
		return l.Live()
	}
	return src.Current(), 0
}

// staticChain is the replica's regionsync.Chain with the source's live
// config adopted: static shares are the smallest under the configs the
// global tier has not yet confirmed past. Safe for concurrent use.
func (s *Server) staticChain() regionsync.Chain {
	cfg, rev := live(s.opts.Config)
	if c := s.chain.Load(); c.Current().Cfg == cfg {
		return *c
	}
	s.chainMu.Lock()
	defer s.chainMu.Unlock()
	c := s.chain.Load().Adopt(rev, cfg)
	s.chain.Store(&c)
	return c
}

// reportedChain marks the chain's revisions as reported and returns them,
// for the region leader's report (before it is sent).
func (s *Server) reportedChain() []int64 {
	s.staticChain()
	s.chainMu.Lock()
	defer s.chainMu.Unlock()
	c, revs := s.chain.Load().Reported()
	s.chain.Store(&c)
	return revs
}

// confirm applies a revision the global tier confirmed. A shard map the
// chain drops starts its retention at once (shardMaps).
func (s *Server) confirm(rev int64) {
	s.chainMu.Lock()
	c := s.chain.Load().Confirm(rev)
	s.chain.Store(&c)
	s.chainMu.Unlock()
	s.shardMaps()
}

// answered applies the global tier's answer to the chain and stores its
// confirmed revision for the region's other replicas.
func (s *Server) answered(ctx context.Context, g *sluicev1.RegionGrants) {
	s.chainMu.Lock()
	c := s.chain.Load().Answered(g)
	s.chain.Store(&c)
	s.chainMu.Unlock()
	s.shardMaps()
	if g.GetConfirmedKnown() {
		if err := s.opts.Redis.Set(ctx, s.confirmedKey(), g.GetConfirmedRevision(), 0).Err(); err != nil {
			s.log.Warn("storing the confirmed config revision failed; other replicas keep the smaller static shares", "err", err)
		}
	}
}

// confirmedKey holds the revision last confirmed to the region leader, so
// that the region's other replicas apply it too.
func (s *Server) confirmedKey() string { return s.opts.Prefix + "confirmed" }

// followConfirmations applies the confirmed revision the region leader
// stored, every epoch, until ctx ends. It adopts the source's live config
// first: a replica adopts a config on its first request under it, so one
// that served nothing across a change would otherwise meet the
// confirmation of a revision it does not hold (Chain.Confirm ignores it),
// and its first request would then adopt the new config as unconfirmed
// and run the smaller of the old and new shares until a later
// confirmation; a bucket that request creates keeps the old share's level
// (a raised tenant's first burst cut to the old cap).
func (s *Server) followConfirmations(ctx context.Context) {
	for {
		epoch := time.Duration(s.opts.Config.Current().Epoch)
		t := time.NewTimer(epoch)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, epoch)
		v, err := s.opts.Redis.Get(rctx, s.confirmedKey()).Result()
		cancel()
		if err != nil {
			if err != redis.Nil && ctx.Err() == nil {
				s.log.Debug("reading the confirmed config revision failed", "err", err)
			}
			continue
		}
		if rev, err := strconv.ParseInt(v, 10, 64); err == nil {
			s.staticChain()
			s.confirm(rev)
		}
	}
}
