package regional

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/pkg/shard"
)

// The region's side of the sharded global tier (regionsync's shard.go has
// the rules): the leader splits each report by the shard map of the config
// it runs and sends the parts in parallel, one global tier per shard,
// installs from each answer only the grants of keys that shard owns, and
// keeps one static lease per shard in the region's Redis; every replica
// hands a key its static share only while the leases of its owners under
// every shard map in play are valid.

// mapsView is the shard maps a replica's keys are leased under: those of
// its chain's configs, then those dropped from the chain less than one
// grant validity and one epoch ago.
type mapsView struct {
	chain   *regionsync.Chain // the chain the maps were computed for
	maps    []shard.Map
	recheck time.Time // when a retained map expires (zero: none retained)
}

// shardMaps is the replica's shard maps in play (mapsView). Safe for
// concurrent use; the hot path reads an atomic pointer.
func (s *Server) shardMaps() []shard.Map {
	c := s.chain.Load()
	if v := s.maps.Load(); v != nil && v.chain == c && (v.recheck.IsZero() || time.Now().Before(v.recheck)) {
		return v.maps
	}
	s.mapsMu.Lock()
	defer s.mapsMu.Unlock()
	c = s.chain.Load()
	now := time.Now()
	cur := c.ShardMaps()
	cfg := c.Current().Cfg
	if cfg == nil {
		cfg = s.opts.Config.Current()
	}
	keep := time.Duration(cfg.GrantValidity + cfg.Epoch)
	if s.retired == nil {
		s.retired = make(map[int]time.Time)
	}
	for _, m := range s.lastMaps {
		if !hasMap(cur, m) {
			s.retired[m.N()] = now.Add(keep)
		}
	}
	for _, m := range cur {
		delete(s.retired, m.N())
	}
	s.lastMaps = cur
	v := &mapsView{chain: c, maps: append([]shard.Map(nil), cur...)}
	for n, until := range s.retired {
		if !now.Before(until) {
			delete(s.retired, n)
			continue
		}
		m, err := shard.New(n)
		if err != nil {
			continue
		}
		v.maps = append(v.maps, m)
		if v.recheck.IsZero() || until.Before(v.recheck) {
			v.recheck = until
		}
	}
	s.maps.Store(v)
	return v.maps
}

func hasMap(maps []shard.Map, m shard.Map) bool {
	for _, x := range maps {
		if x.N() == m.N() {
			return true
		}
	}
	return false
}

// shardsInPlay is how many shards' leases the replica reads: the largest
// count among the maps in play.
func (s *Server) shardsInPlay() int {
	n := s.opts.Config.Current().ShardMap().N()
	for _, m := range s.shardMaps() {
		n = max(n, m.N())
	}
	return n
}

// tier is shard i's global tier.
func (l *Leader) tier(i int) (GlobalTier, error) {
	if l.opts.Shards != nil {
		return l.opts.Shards(i)
	}
	if i == 0 {
		return l.opts.Global, nil
	}
	return nil, fmt.Errorf("no global tier for shard %d: LeaderOptions.Shards is not set", i)
}

// loadStatic reads Redis TIME and the stored static leases in one round
// trip: a new leader takes over its predecessor's leases before its first
// report.
func (l *Leader) loadStatic(ctx context.Context) (regionsync.RedisClock, error) {
	s := l.s
	stored, rises, clock, err := readStatic(ctx, s.opts.Redis, s.opts.Prefix, s.shardsInPlay())
	if err != nil {
		return clock, err
	}
	l.leases = l.leases.Merge(stored)
	s.noteStatic(l.leases, rises, clock)
	return clock, nil
}

// syncShards sends each shard its part of report (sent at sendUS) in
// parallel and installs each answer's grants for the keys that shard owns
// under cfg's map. The answers that came are installed whatever the others
// did; the error names every shard that failed.
func (l *Leader) syncShards(ctx context.Context, lost <-chan struct{}, cfg *config.Config, report *sluicev1.RegionReport,
	plans map[quota.Key]keyPlan, held regionsync.Held, sendUS int64) (regionsync.Answer, error) {
	s := l.s
	m := cfg.ShardMap()
	n := m.N()
	parts := make([]*sluicev1.RegionReport, n)
	// Each part names its shard, so a replica of another shard that the
	// address reaches refuses it rather than taking it as this region's
	// report to that shard.
	if n == 1 {
		report.StaticValidMs = l.leases.Of(0).ValidMs(sendUS)
		report.Shard = proto.Uint32(0)
		parts[0] = report
	} else {
		for i := range parts {
			parts[i] = &sluicev1.RegionReport{Region: report.GetRegion(), Seq: report.GetSeq(),
				ConfigRevisions: report.GetConfigRevisions(), StaticValidMs: l.leases.Of(i).ValidMs(sendUS),
				Shard: proto.Uint32(uint32(i))}
		}
		for _, kd := range report.GetKeys() {
			i := m.Of(quota.Key{Tenant: kd.GetKey().GetTenant(), Class: kd.GetKey().GetClass()})
			parts[i].Keys = append(parts[i].Keys, kd)
		}
	}
	answers := make([]*sluicev1.RegionGrants, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range parts {
		wg.Go(func() {
			tier, err := l.tier(i)
			if err == nil {
				answers[i], err = tier.Sync(ctx, parts[i])
			}
			errs[i] = err
		})
	}
	wg.Wait()
	select {
	case <-lost:
		return regionsync.Answer{}, errLeadershipLost
	default:
	}
	var out regionsync.Answer
	var failed []error
	for i, g := range answers {
		if errs[i] != nil {
			if n == 1 {
				failed = append(failed, fmt.Errorf("global sync: %w", errs[i]))
			} else {
				failed = append(failed, fmt.Errorf("global sync: shard %d of %d: %w", i, n, errs[i]))
			}
			continue
		}
		s.answered(ctx, g)
		l.staticAnswered(ctx, i, g, sendUS)
		if n > 1 {
			g = ownGrants(g, m, i)
		}
		a, err := l.install(ctx, cfg, g, plans, held, sendUS)
		if err != nil {
			failed = append(failed, err)
		}
		out.Lowered = out.Lowered || a.Lowered
		if a.Again > 0 && (out.Again == 0 || a.Again < out.Again) {
			out.Again = a.Again
		}
	}
	return out, errors.Join(failed...)
}

// ownGrants is g with only the grants of keys shard i owns under m: a
// region accepts a key's grants only from its owner under the map it runs.
func ownGrants(g *sluicev1.RegionGrants, m shard.Map, i int) *sluicev1.RegionGrants {
	kept := make([]*sluicev1.KeyGrant, 0, len(g.GetGrants()))
	for _, kg := range g.GetGrants() {
		if k := kg.GetKey(); k != nil && m.Of(quota.Key{Tenant: k.GetTenant(), Class: k.GetClass()}) != i {
			continue
		}
		kept = append(kept, kg)
	}
	return &sluicev1.RegionGrants{Region: g.GetRegion(), Seq: g.GetSeq(), Grants: kept, Learning: g.GetLearning(),
		Epoch: g.GetEpoch(), ReportAgainMs: g.GetReportAgainMs(), StaticLeaseMs: g.GetStaticLeaseMs(),
		ConfirmedRevision: g.GetConfirmedRevision(), ConfirmedKnown: g.GetConfirmedKnown()}
}

// staticAnswered applies the static lease shard i's answer confers and
// stores it for the region's replicas and the next leader.
func (l *Leader) staticAnswered(ctx context.Context, i int, g *sluicev1.RegionGrants, sendUS int64) {
	cur := l.leases.Of(i)
	next, err := cur.Answered(g, sendUS)
	if err != nil {
		l.s.log.Warn("global tier sent an invalid static lease; ignored", "shard", i, "err", err)
	}
	if next.UntilUS > cur.UntilUS {
		l.leases = l.leases.With(i, next)
		l.storeStatic(ctx, i, cur)
	}
}

// storeStatic publishes the leader's static leases to this process's
// replica view and shard i's to the region's Redis (never lowering it
// there); prev is the leader's lease of shard i before. A failed write leaves the other replicas on what they read
// before: at worst that shard's keys on their floor. A lease that comes
// back from its end raises the shard's rise in the view at once
// (noteStatic) and in Redis with the lease (raiseStatic).
func (l *Leader) storeStatic(ctx context.Context, i int, prev regionsync.StaticLease) {
	l.s.noteStatic(l.leases, nil, regionsync.RedisClock{})
	validity := time.Duration(l.s.opts.Config.Current().GrantValidity)
	if err := storeStatic(ctx, l.s.opts.Redis, l.s.opts.Prefix, i, l.leases.Of(i), prev, validity); err != nil {
		l.s.log.Warn("storing the static lease failed; other replicas may run its keys on their floor until the next answer", "shard", i, "err", err)
	}
	// Reported even when the write failed: this process's replica runs on
	// the lease anyway, and a write whose answer was lost may have landed.
	if l.opts.OnStaticLease != nil {
		l.opts.OnStaticLease(i, l.leases.Of(i).UntilUS)
	}
}

// globalElection is where shard i's allocator replicas campaign
// (pkg/allocator's elector: the store's election prefix +
// shard.ElectionName, its candidates' keys under it + "/").
func (l *Leader) globalElection(i int) string {
	return l.opts.ElectionPrefix + shard.ElectionName(i) + "/"
}

// NoGlobalLeader applies the etcd rule of the static lease to every shard
// of the config the region runs: it reads, linearizably, whether any
// replica of the shard holds an election key, between two readings of
// Redis TIME; for a shard with none, regionsync may extend its still
// running static lease (regionsync.StaticLease.NoGlobalLeader). The leader
// calls it after a failed sync: when a shard is down rather than cut off,
// the region keeps its keys' static shares. It reports whether a lease
// grew.
func (l *Leader) NoGlobalLeader(ctx context.Context) (bool, error) {
	s := l.s
	cfg := s.opts.Config.Current()
	// However long the reads take, the extension counts from before the
	// etcd reads and needs the lease still running after them.
	ctx, cancel := context.WithTimeout(ctx, max(time.Duration(cfg.Epoch), s.opts.RedisTimeout))
	defer cancel()
	stored, rises, from, err := readStatic(ctx, s.opts.Redis, s.opts.Prefix, s.shardsInPlay())
	if err != nil {
		return false, err
	}
	l.leases = l.leases.Merge(stored)
	s.noteStatic(l.leases, rises, from)
	n := cfg.ShardMap().N()
	empty := make([]bool, n)
	none := false
	for i := range n {
		resp, err := l.opts.Etcd.Get(ctx, l.globalElection(i), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, fmt.Errorf("etcd: read shard %d's global election: %w", i, err)
		}
		empty[i] = resp.Count == 0
		none = none || empty[i]
		if !empty[i] {
			l.extensionsOver(time.Now(), i, "a global leader is elected")
		}
	}
	if !none {
		return false, nil
	}
	to, err := s.opts.Redis.Time(ctx).Result()
	if err != nil {
		return false, fmt.Errorf("redis time: %w", err)
	}
	grew := false
	for i := range n {
		if !empty[i] {
			continue
		}
		cur := l.leases.Of(i)
		next := cur.NoGlobalLeader(from.RedisUS, to.UnixMicro(), time.Duration(cfg.RegionLease))
		if next.UntilUS <= cur.UntilUS {
			continue
		}
		l.leases = l.leases.With(i, next)
		grew = true
		if l.extended == nil {
			l.extended = map[int]*outage{}
		}
		if l.extended[i] == nil {
			l.extended[i] = &outage{}
		}
		valid := time.Duration(next.ValidMs(to.UnixMicro())) * time.Millisecond
		if l.extended[i].see(time.Now()) {
			s.log.Info("no global leader elected: static lease extended (at each failed sync; logged again when it stops)",
				"region", s.opts.Region, "shard", i, "static_valid", valid)
		} else {
			s.log.Debug("no global leader elected: static lease extended again", "region", s.opts.Region, "shard", i, "static_valid", valid)
		}
		l.storeStatic(ctx, i, cur)
	}
	return grew, nil
}

// shardWatch keeps a nudge stream open to every shard of the config the
// region runs whose tier can deliver nudges (Nudger), sending to nudges
// (never blocking) for each, until ctx ends. The leader calls open at its
// election and on every epoch, so a shard added to the config while it
// leads is watched from the next epoch on; a stream to a shard the config
// no longer names stays open until the leader steps down (nudges only
// hasten reports). Used by the leader's goroutine only.
type shardWatch struct {
	l      *Leader
	ctx    context.Context
	retry  time.Duration
	nudges chan<- struct{}
	open   map[int]bool // shards with a stream (or a tier that cannot nudge)
	wg     sync.WaitGroup
}

func (l *Leader) newShardWatch(ctx context.Context, retry time.Duration, nudges chan<- struct{}) *shardWatch {
	return &shardWatch{l: l, ctx: ctx, retry: retry, nudges: nudges, open: map[int]bool{}}
}

// openAll opens a stream to each shard of the current config that has
// none; a shard whose tier cannot be had now is tried again next time.
func (w *shardWatch) openAll() {
	for i := range w.l.s.opts.Config.Current().ShardMap().N() {
		if w.open[i] {
			continue
		}
		tier, err := w.l.tier(i)
		if err != nil {
			continue
		}
		w.open[i] = true
		n, ok := tier.(Nudger)
		if !ok {
			continue
		}
		w.wg.Go(func() {
			n.Watch(w.ctx, w.l.s.opts.Region, w.retry, func() {
				select {
				case w.nudges <- struct{}{}:
				default: // one is pending already
				}
			})
		})
	}
}

// wait returns when every stream ended (after ctx ended).
func (w *shardWatch) wait() { w.wg.Wait() }
