package regional

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/pkg/shard"
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

// configHistory is the optional read of the configs earlier revisions
// committed (configstore.Watcher has it): a process starting on a newer
// config reads the one last confirmed to its region with it.
type configHistory interface {
	History(ctx context.Context, from, until int64, max int) ([]configstore.Committed, error)
}

// ResumeChain starts the replica's chain from its region's history
// (regionsync.StartChain): when the revision last confirmed to the region,
// as the region leader stored it in Redis (confirmedKey), differs from the
// one of the config the process started on, it reads from etcd, through
// the config source, that revision's config and those committed after it
// (the region may have seen one of them confirmed without storing that
// yet), and starts with the first confirmed and the others and its own
// adopted since. Its static shares are then the smallest under them until
// confirmations pass them, as for a process that ran through the change:
// a region restarted onto a raised share while another region still runs
// the old config keeps Σ static shares within the limit. Call it once,
// after New and before the server serves or its leader syncs (StartDaemon
// does); it does nothing once the chain moved on (a config adopted or a
// confirmation applied meanwhile).
//
// It never delays the start for long: the Redis read is bounded by
// RedisTimeout, the etcd read by the source (configstore.Watcher.History:
// one read at start). When it cannot read the confirmed config, the
// config the process starts on counts as confirmed, as before, and it logs
// a warning and returns why (counted in
// sluice_regional_chain_started_unconfirmed_total; the process runs
// unconfirmed, sluice_regional_chain_unconfirmed 1, until a later read or
// a confirmation ends it): Redis not answering, the stored revision
// unreadable in etcd (compacted, etcd down), or a config source with
// revisions but no reads of earlier ones. Of those, Redis or etcd not
// answering may pass: StartDaemon then reads again in the background
// (ResumeChainRetryable says which errors; resumeLate). When it read the
// confirmed config but not all those committed since, it starts with
// those it read, logs a warning and returns why. Nothing is needed, and
// nil returned, for a region with no global tier (Unleased), a static
// config (revision 0), a region with no stored revision (a fresh region,
// or a Redis that lost its data: the residual gap of
// docs/architecture.md), or a process starting on the stored revision
// itself.
func (s *Server) ResumeChain(ctx context.Context) error {
	_, err := s.resumeChain(ctx, false)
	return err
}

// errUnanswered marks a failure of ResumeChain that may pass: Redis or
// etcd did not answer.
type errUnanswered struct{ err error }

func (e errUnanswered) Error() string { return e.err.Error() }
func (e errUnanswered) Unwrap() error { return e.err }

// ResumeChainRetryable says whether an error of ResumeChain may pass on a
// later read: Redis or etcd not answering (a timeout, a refused
// connection, an etcd with no leader). A compacted revision, a config
// source with no history, a stored value that is no revision, or Redis
// refusing this replica's credentials or commands do not pass by waiting.
func ResumeChainRetryable(err error) bool {
	var u errUnanswered
	return errors.As(err, &u)
}

// etcdUnanswered says whether err, from reading the config history, is
// etcd not answering rather than an answer (a compacted revision:
// configstore.ErrHistoryGone; a revision that wrote no config; a config
// that does not validate): a deadline, or the gRPC codes etcd's client
// gives a server it cannot reach, one with no leader or one that timed
// out.
func etcdUnanswered(err error) bool {
	if errors.Is(err, configstore.ErrHistoryGone) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable || ee.Code() == codes.DeadlineExceeded
	}
	if st, ok := status.FromError(err); ok {
		return st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded
	}
	return false
}

// resumeChain is ResumeChain; late for a read after the start
// (resumeLate), which says whether to read again: true only after Redis or
// etcd did not answer. A late read applies the history only while the
// chain is still the one the process started on (one config, the one it
// started on, counted as confirmed: sluice_regional_chain_unconfirmed 1).
//
// Applying the history late is safe: the chain it makes holds the
// config the process runs and the older ones its region may still be
// bound by, so it can only lower a static share (Share is the smallest
// under the chain's configs), at once, as adopting a config that lowers a
// share does mid-run; a raise waits for a confirmation, which the global
// tier gives only once every region reported the revision. What the
// process handed out before under the larger share stays handed out (the
// window a read at start would not have opened); from then on it runs as
// a process that read the history at start.
func (s *Server) resumeChain(ctx context.Context, late bool) (retry bool, err error) {
	if s.opts.Unleased {
		return false, nil
	}
	start := s.chain.Load()
	cur := start.Current()
	if start.Len() != 1 || cur.Rev == 0 || (late && cur.Rev != s.unconfirmedRev.Load()) {
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
	v, err := s.opts.Redis.Get(rctx, s.confirmedKey()).Result()
	cancel()
	if errors.Is(err, redis.Nil) {
		if late {
			// Redis lost its data meanwhile: nothing is left to read, and
			// the process still runs unconfirmed until a confirmation.
			s.log.Warn("the region's Redis holds no confirmed config revision any more; no longer read again: until the region confirms it, the config this process runs counts as confirmed",
				"region", s.opts.Region, "revision", cur.Rev)
		}
		return false, nil
	}
	unconfirmed := func(err error, retry bool, msg string, args ...any) (bool, error) {
		args = append([]any{"region", s.opts.Region, "revision", cur.Rev, "err", err}, args...)
		if retry {
			err = errUnanswered{err}
		}
		switch {
		case late && retry:
			s.log.Debug(msg+"; reading it again later", args...)
		case late:
			s.log.Warn(msg+"; no longer read again: until the region confirms it, the config this process runs counts as confirmed, and its static shares may run above those of the config other regions may still run", args...)
		default:
			s.metrics.startedUnconfirmed.Inc()
			s.unconfirmedRev.Store(cur.Rev)
			if retry {
				msg += "; read again in the background until it answers"
			}
			s.log.Warn(msg+"; the config this process starts on counts as confirmed: until the region confirms it, its static shares may run above those of the config other regions may still run", args...)
		}
		return retry, err
	}
	if err != nil {
		err = ExplainRedisErr(err)
		return unconfirmed(fmt.Errorf("reading the confirmed config revision: %w", err), !errors.Is(err, ErrRedisRefused),
			"the revision last confirmed to the region could not be read from Redis")
	}
	stored, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return unconfirmed(fmt.Errorf("%s holds %q, not a revision", s.confirmedKey(), v), false,
			"the revision last confirmed to the region is unreadable in Redis")
	}
	if !regionsync.NeedsHistory(stored, cur.Rev) {
		if late && s.unconfirmedRev.CompareAndSwap(cur.Rev, 0) {
			s.log.Info("the region confirmed the config this process started on: it no longer runs unconfirmed",
				"region", s.opts.Region, "revision", cur.Rev)
		}
		return false, nil
	}
	src, ok := s.opts.Config.(configHistory)
	if !ok {
		return unconfirmed(errors.New("the config source reads no earlier revisions"), false,
			"the config last confirmed to the region cannot be read", "confirmed_revision", stored)
	}
	read, err := src.History(ctx, stored, cur.Rev, regionsync.MaxChain-1)
	if len(read) == 0 {
		if ctx.Err() != nil && late {
			return false, ctx.Err() // the daemon stops
		}
		return unconfirmed(fmt.Errorf("reading the config of revision %d: %w", stored, cmp.Or(err, errors.New("none read"))), etcdUnanswered(err),
			"the config last confirmed to the region could not be read from etcd (compacted, or etcd not answering)", "confirmed_revision", stored)
	}
	if err != nil {
		s.log.Warn("the configs committed after the one last confirmed to the region could not all be read; the process runs bounded by those read: one of the others, if confirmed but not yet stored, no longer bounds its static shares",
			"region", s.opts.Region, "revision", cur.Rev, "confirmed_revision", stored, "read", len(read), "err", err)
	}
	history := make([]regionsync.Revision, len(read))
	revs := make([]int64, len(read))
	for i, e := range read {
		history[i], revs[i] = regionsync.Revision{Rev: e.Rev, Cfg: e.Cfg}, e.Rev
	}
	s.chainMu.Lock()
	defer s.chainMu.Unlock()
	// The chain moved on (a config adopted, a confirmation applied: the
	// latter clears unconfirmedRev under chainMu). A report in between
	// (Reported) stores a new chain but leaves it the same one config.
	if c := s.chain.Load(); c.Len() != 1 || c.Current() != cur || (late && s.unconfirmedRev.Load() != cur.Rev) {
		return false, nil
	}
	c := regionsync.StartChain(history, cur)
	s.storeChain(c)
	if late {
		s.unconfirmedRev.Store(0)
		s.metrics.resumedLate.Inc()
		s.log.Info("read the region's history late: static shares are now the smallest under the configs not yet confirmed past too, until the region confirms the one it runs",
			"region", s.opts.Region, "revision", cur.Rev, "confirmed_revision", stored, "revisions", revs)
		return false, err
	}
	s.log.Info("started under the configs not yet confirmed past too: static shares are the smallest under them until the region confirms the one it runs",
		"region", s.opts.Region, "revision", cur.Rev, "confirmed_revision", stored, "revisions", revs)
	return false, err
}

// resumeRetryMaxEpochs bounds the wait between two late reads of the
// region's history (resumeLate), in epochs.
const resumeRetryMaxEpochs = 16

// resumeLate reads the region's history again after ResumeChain found
// Redis or etcd not answering at the start: after one epoch, then after
// waits doubling up to resumeRetryMaxEpochs epochs (each read costs a
// Redis GET and, when the history is needed, one etcd read bounded as at
// start), until a read succeeds, finds nothing to do (the chain moved on,
// the region confirmed the config) or fails in a way that does not pass,
// or ctx ends.
func (s *Server) resumeLate(ctx context.Context) {
	epoch := func() time.Duration { return time.Duration(s.opts.Config.Current().Epoch) }
	retryBackoff(ctx, epoch, resumeRetryMaxEpochs, func(ctx context.Context) bool {
		retry, _ := s.resumeChain(ctx, true)
		return retry
	})
}

// retryBackoff calls attempt after one base interval, then after waits
// doubling up to maxFactor base intervals (base read before each wait: a
// config change applies at the next), for as long as it returns true and
// ctx has not ended.
func retryBackoff(ctx context.Context, base func() time.Duration, maxFactor int, attempt func(context.Context) bool) {
	for n := 1; ; n = min(2*n, maxFactor) {
		t := time.NewTimer(time.Duration(n) * base())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if !attempt(ctx) {
			return
		}
	}
}

// staticChain is the replica's regionsync.Chain with the source's live
// config adopted: static shares are the smallest under the configs the
// global tier has not yet confirmed past; with no global tier (Unleased)
// the live config's alone. Safe for concurrent use.
func (s *Server) staticChain() regionsync.Chain {
	cfg, rev := live(s.opts.Config)
	if c := s.chain.Load(); c.Current().Cfg == cfg {
		return *c
	}
	s.chainMu.Lock()
	defer s.chainMu.Unlock()
	var c regionsync.Chain
	if s.opts.Unleased {
		// Nothing ever confirms a revision to a region with no global
		// tier: it runs the config it adopts, alone, as before static
		// leases (Options.Unleased). A chain of every config it adopted
		// would bound it by the smallest share it ever ran, a raise never
		// applied and a class added later held at a burst of 0.
		c = regionsync.NewChain(rev, cfg)
	} else {
		c = s.chain.Load().Adopt(rev, cfg)
	}
	s.storeChain(c)
	return c
}

// storeChain makes c the replica's chain and hands it to Options.OnChain;
// the caller holds chainMu (or New, before the server is shared).
func (s *Server) storeChain(c regionsync.Chain) {
	s.chain.Store(&c)
	if s.opts.OnChain != nil {
		s.opts.OnChain(c)
	}
}

// reportedChain marks the chain's revisions as reported and returns them,
// for the region leader's report (before it is sent).
func (s *Server) reportedChain() []int64 {
	s.staticChain()
	s.chainMu.Lock()
	defer s.chainMu.Unlock()
	c, revs := s.chain.Load().Reported()
	s.storeChain(c)
	return revs
}

// confirm applies a revision the global tier confirmed, as the region
// leader stored it (followConfirmations).
func (s *Server) confirm(rev int64) { s.confirmChain(context.Background(), rev, false) }

// answered applies the global tier's answer to the chain and stores its
// confirmed revision for the region's other replicas.
func (s *Server) answered(ctx context.Context, g *sluicev1.RegionGrants) {
	if !g.GetConfirmedKnown() {
		s.shardMaps()
		return
	}
	s.confirmChain(ctx, g.GetConfirmedRevision(), true)
	if err := s.opts.Redis.Set(ctx, s.confirmedKey(), g.GetConfirmedRevision(), 0).Err(); err != nil {
		s.log.Warn("storing the confirmed config revision failed; other replicas keep the smaller static shares", "err", err)
	}
}

// confirmChain applies the confirmation of rev to the chain. A shard map
// the chain drops starts its retention at once (shardMaps). When the
// confirmation lifts a drain of this region (regionsync.DrainLifted: the
// last config draining it dropped), the region comes back from its floor:
// before the chain applies it, every shard's rise is raised (drainLifted),
// in Redis too when store (the region leader, which stores the
// confirmation for the other replicas only after that). The chain's lock
// is held meanwhile, so no request runs the lifted share before the rise
// is known; a request meets the lock only when it adopts a new config.
// Every confirmation that drops a config may raise a share: this process
// remembers it with the chain before it (regionsync.ConfigRises), dated on
// its estimate of Redis time, before the chain applies it. A process that
// never read Redis time has handed out no static share yet (its estimate
// is the far future) and remembers nothing: like one that starts after
// the confirmation.
func (s *Server) confirmChain(ctx context.Context, rev int64, store bool) {
	s.chainMu.Lock()
	old := *s.chain.Load()
	next := old.Confirm(rev)
	if !s.opts.Unleased && regionsync.DrainLifted(s.opts.Region, old, next) {
		s.drainLifted(ctx, store)
	}
	if v := s.static.Load(); !s.opts.Unleased && !v.clock.Sent.IsZero() && regionsync.MayRaise(old, next) {
		var rises regionsync.ConfigRises
		if p := s.configRises.Load(); p != nil {
			rises = *p
		}
		rises = rises.Confirmed(old, next, v.clock.Estimate(time.Now()))
		s.configRises.Store(&rises)
	}
	s.storeChain(next)
	// A process that started unconfirmed on u (ResumeChain) is confirmed
	// once the region confirms u itself, or a later config the chain held
	// (the confirmed one is no longer u).
	if u := s.unconfirmedRev.Load(); u != 0 && (rev == u || next.Confirmed() != u) {
		s.unconfirmedRev.Store(0)
	}
	s.chainMu.Unlock()
	s.shardMaps()
}

// drainLifted raises the rise of every shard the config may ever name
// (shard.MaxShards), so a shard added later holds it for the keys it
// takes over: when store, the stored ones to Redis time (a failed write is
// logged: the other replicas still notice the lift when they apply the
// stored confirmation, but a process started later does not see it); and
// this process's view to its estimate of Redis time now (an upper bound),
// or to the time written when its view never read Redis (its first
// reading then finds the stored rises).
func (s *Server) drainLifted(ctx context.Context, store bool) {
	n := shard.MaxShards
	var rise int64
	if store {
		wctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
		us, err := storeRises(wctx, s.opts.Redis, s.opts.Prefix, n)
		cancel()
		if err != nil {
			s.log.Warn("storing the rise of a drain lifted failed; a replica started later may credit idle keys at the restored share", "region", s.opts.Region, "err", err)
		}
		rise = us
	}
	if v := s.static.Load(); !v.clock.Sent.IsZero() {
		rise = max(rise, v.clock.Estimate(time.Now()))
	}
	if rise > 0 {
		s.noteRiseAll(n, rise)
	}
	s.log.Info("drain lifted: the region comes back from its floor", "region", s.opts.Region, "rise_us", rise)
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
