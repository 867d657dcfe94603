package regional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/election"
	"github.com/sluicehq/sluice/internal/logthrottle"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// GlobalTier is how the region leader reaches the global allocator
// (allocator.Client follows the global leader).
type GlobalTier interface {
	Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error)
}

// Nudger is a GlobalTier that can also deliver the global leader's nudges
// (allocator.Client): Watch calls nudge for each until ctx ends, retrying
// a lost stream after retry. A region leader whose GlobalTier is not a
// Nudger reports once per epoch (and for acknowledgements and catch-ups)
// only.
type Nudger interface {
	Watch(ctx context.Context, region string, retry time.Duration, nudge func())
}

// LeaderOptions configure the region leader loop.
type LeaderOptions struct {
	// Etcd elects one leader per region. Required.
	Etcd *clientv3.Client
	// ElectionPrefix is where election keys live (configstore.Store's
	// ElectionPrefix, "<prefix>/election/"). Required.
	ElectionPrefix string
	// Global is the global tier. Required; with Shards set it is only
	// checked, Shards(0) serves shard 0.
	Global GlobalTier
	// Shards, optional, is each global-tier shard's tier (an
	// allocator.Client per shard), called with 0..global_shards-1 of the
	// config the region runs. Without it Global is shard 0 and a config
	// with more shards leaves the others' keys unreported (on their floor
	// once those shards' static leases end).
	Shards func(shard int) (GlobalTier, error)
	// Identity is this replica's value in the election (its address).
	// Required.
	Identity string
	// SessionTTL is the etcd session TTL. Optional, default 5s.
	SessionTTL time.Duration
	// OnApplied, optional, is called for every grant the region's Redis
	// applied (set_rate accepted it), with the expiry in Redis time (µs),
	// before the report that follows it is sent: an observer sees a
	// donor's smaller grant before the global tier can hand the difference
	// to anyone. Called from the leader loop; it must not block.
	OnApplied func(k quota.Key, rate, burst float64, expiryUS int64)
	// OnHeld, optional, is called for every key a report is built from
	// whose state read found a grant held, with the grant's rate, burst
	// and expiry exactly as Redis stores them (expiry in Redis time, µs),
	// before the report is sent. It sees what OnApplied cannot: a grant
	// Redis applied whose set_rate answer the leader never got (a call
	// that timed out on a starved machine after the script ran), or one
	// another leader of the region installed, before the global tier can
	// act on the report's echo of it. The echo alone cannot say when the
	// grant ends: its validity counts from the read, which the report
	// does not date. Called from the leader loop; it must not block.
	OnHeld func(k quota.Key, rate, burst float64, expiryUS int64)
	// OnStaticLease, optional, is called each time the leader extended
	// its static lease from global-tier shard and stored the new end
	// (Redis time, µs) in the region's Redis, after the write (also when
	// it failed: the leader's own replica runs on the lease anyway, and a
	// write whose answer was lost may have landed). The stored end only
	// grows: a write below the stored end leaves it, so the end the
	// region's replicas may run on is the largest reported since its
	// Redis last lost its data. Called from the leader loop; it must not
	// block.
	OnStaticLease func(shard int, untilUS int64)
}

// Leader is the region leader loop's state. Only Run's goroutine uses the
// unexported fields.
type Leader struct {
	s    *Server
	opts LeaderOptions

	// sync makes every decision of the reports (regionsync); this type
	// only reads and writes Redis and talks to the global tier.
	sync *regionsync.Leader

	// ignoredGrants spaces the log lines about grants the region cannot
	// install: one a minute per class left out of the config, one a
	// minute for any other reason.
	ignoredGrants *logthrottle.Throttle
	// leading is observed by tests and metrics.
	leading chan bool
	// isLeading is set while this replica leads its region.
	isLeading atomic.Bool
	// leases is the region's static lease from each global-tier shard as
	// this leadership knows it (shards.go). Only Run's goroutine uses it.
	leases regionsync.ShardLeases
	// fresh is the looks between epochs at the candidate set for newly
	// marked keys (freshKeys). Only Run's goroutine uses it.
	fresh regionsync.FreshWatch
	// untrimmed counts the epoch reports since the last one that trimmed
	// the candidate sets of a Redis Cluster (candidates). Only Run's
	// goroutine uses it.
	untrimmed int
	// syncDown is the failing syncs with the global tier, and extended
	// each shard's static lease extensions by the etcd rule, each logged
	// once when it starts and once when it ends. Only Run's goroutine
	// uses them.
	syncDown outage
	extended map[int]*outage
}

// outage is a condition seen again and again (every epoch) that is
// logged once when it starts and once when it ends, with how long it
// lasted and how many times it was seen, as the other outages are (a
// Redis that does not answer its readiness ping), not each time.
type outage struct {
	since time.Time // zero: not under way
	seen  int
}

// see notes the condition at now and reports whether it starts with it.
func (o *outage) see(now time.Time) (starts bool) {
	o.seen++
	if o.since.IsZero() {
		o.since = now
		return true
	}
	return false
}

// end notes the condition over at now: ok false when it was not under
// way; else how long it lasted and how many times it was seen.
func (o *outage) end(now time.Time) (lasted time.Duration, seen int, ok bool) {
	if o.since.IsZero() {
		return 0, 0, false
	}
	lasted, seen = now.Sub(o.since), o.seen
	*o = outage{}
	return lasted, seen, true
}

// NewLeader prepares the region leader loop of s.
func NewLeader(s *Server, o LeaderOptions) (*Leader, error) {
	if o.Etcd == nil || o.Global == nil || o.ElectionPrefix == "" || o.Identity == "" {
		return nil, errors.New("regional: leader needs Etcd, Global, ElectionPrefix and Identity")
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = 5 * time.Second
	}
	return newLeader(s, o), nil
}

// newLeader is NewLeader past its checks of o.
func newLeader(s *Server, o LeaderOptions) *Leader {
	return &Leader{s: s, opts: o, sync: regionsync.NewLeader(), leading: make(chan bool, 1), ignoredGrants: logthrottle.New(time.Minute)}
}

// Run campaigns for the region's leadership and, while leading, syncs with
// the global tier every epoch. It returns when ctx ends. Replicas that are
// not leader keep serving leases; only the leader talks to the global tier.
func (l *Leader) Run(ctx context.Context) error {
	key := l.opts.ElectionPrefix + "region/" + l.s.opts.Region
	// Every replica applies the confirmed config revision the leader
	// stores, whoever leads.
	follow := make(chan struct{})
	fctx, stop := context.WithCancel(ctx)
	go func() { defer close(follow); l.s.followConfirmations(fctx) }()
	defer func() { stop(); <-follow }()
	for ctx.Err() == nil {
		if err := l.lead(ctx, key); err != nil && ctx.Err() == nil {
			l.s.log.Warn("region leadership lost; campaigning again", "region", l.s.opts.Region, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond): // back off before a new session
			}
		}
	}
	return nil
}

func (l *Leader) lead(ctx context.Context, key string) error {
	sess, err := concurrency.NewSession(l.opts.Etcd, concurrency.WithTTL(int(math.Ceil(l.opts.SessionTTL.Seconds()))), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("etcd session: %w", err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, key)
	if err := election.Campaign(ctx, el, l.opts.Identity); err != nil {
		return fmt.Errorf("campaign %s: %w", key, err)
	}
	if err := election.Confirm(ctx, l.opts.Etcd, el, sess.Lease(), l.opts.SessionTTL); err != nil {
		return fmt.Errorf("campaign %s: %w", key, err)
	}
	l.s.log.Info("region leader elected", "region", l.s.opts.Region, "identity", l.opts.Identity)
	l.setLeading(true)
	defer l.setLeading(false)
	// A new leader starts its demand baseline afresh: the first report of
	// a key after a leader change carries no admitted/denied counts.
	l.sync.Elected()
	l.fresh.Reset()
	l.leases = nil
	// A new term logs the outages it finds afresh: one under way when an
	// earlier term ended was last logged then.
	l.syncDown, l.extended = outage{}, nil
	defer func() {
		// An outage this term logged ends with it: its "succeeds again"
		// will not come from this replica, which no longer syncs.
		if lasted, n, ok := l.syncDown.end(time.Now()); ok {
			l.s.log.Info("region sync with the global tier still failing when this replica stopped leading; the next leader logs its own",
				"region", l.s.opts.Region, "failing_for", lasted.Round(time.Millisecond), "failed_rounds", n)
		}
	}()
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := el.Resign(rctx)
		cancel()
		if ctx.Err() == nil {
			return // the term ended on its own: logged by Run
		}
		// A stop (SIGTERM): say whether the handover is immediate.
		if err != nil {
			l.s.log.Warn("could not resign the region's leadership; another replica takes over once this one's etcd session expires",
				"region", l.s.opts.Region, "session_ttl", l.opts.SessionTTL, "err", err)
			return
		}
		l.s.log.Info("resigned the region's leadership; another replica takes over at once", "region", l.s.opts.Region)
	}()
	epoch := time.Duration(l.s.opts.Config.Current().Epoch)
	t := time.NewTicker(epoch)
	defer t.Stop()
	// Nudges from the global leader start a round between epochs, at most
	// one per regionsync.NudgeSpacing (a nudge sooner waits for it).
	nudges := make(chan struct{}, 1)
	wctx, stopWatch := context.WithCancel(ctx)
	watch := l.newShardWatch(wctx, epoch/2, nudges)
	defer func() { stopWatch(); watch.wait() }()
	watch.openAll()
	// Between epochs the leader watches its contended keys for demand
	// rises and granted keys for falls (regionsync.Leader.Moved) and
	// nudges itself.
	rise := time.NewTicker(regionsync.NudgeSpacing(epoch))
	defer rise.Stop()
	var lastStart time.Time
	var deferred <-chan time.Time // a nudge waiting for the spacing
	// The first round goes at once: a region whose Redis holds no static
	// lease runs on its floor until an answer confers one.
	first := make(chan time.Time, 1)
	first <- time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sess.Done():
			return errors.New("etcd session expired")
		case <-first:
			lastStart = time.Now()
			l.round(ctx, sess.Done(), nudges, regionsync.Epoch)
		case <-t.C:
			watch.openAll() // shards added to the config since the last epoch
			lastStart = time.Now()
			l.round(ctx, sess.Done(), nudges, regionsync.Epoch)
			if e := time.Duration(l.s.opts.Config.Current().Epoch); e != epoch {
				epoch = e
				t.Reset(epoch)
				rise.Reset(regionsync.NudgeSpacing(epoch))
			}
		case <-rise.C:
			if rose, fell := l.moved(ctx); rose || fell {
				if rose {
					l.s.metrics.rises.Inc()
				}
				if fell {
					l.s.metrics.falls.Inc()
				}
				select {
				case nudges <- struct{}{}:
				default:
				}
			}
		case <-nudges:
			if deferred != nil {
				continue
			}
			if wait := regionsync.NudgeWait(lastStart, time.Now(), epoch); wait > 0 {
				deferred = time.After(wait)
				continue
			}
			lastStart = time.Now()
			l.round(ctx, sess.Done(), nudges, regionsync.Nudged)
		case <-deferred:
			deferred = nil
			lastStart = time.Now()
			l.round(ctx, sess.Done(), nudges, regionsync.Nudged)
		}
	}
}

// ownRedisError is a round that failed on the region's own Redis (its
// clock and static lease, its candidates, its keys' states) before any
// report left.
type ownRedisError struct{ err error }

func (e ownRedisError) Error() string { return e.err.Error() }
func (e ownRedisError) Unwrap() error { return e.err }

// errLeadershipLost ends a round whose replica stopped leading before it
// installed the answers.
var errLeadershipLost = errors.New("leadership lost before the grants were installed")

// round is one round of reports starting with one of the given kind
// (Epoch or Nudged); a nudge cuts its waits short (syncRound). After a
// failure the etcd rule of the static lease (NoGlobalLeader) is tried.
func (l *Leader) round(ctx context.Context, lost <-chan struct{}, nudges <-chan struct{}, kind regionsync.Kind) {
	if err := l.syncRound(ctx, lost, nudges, kind); err != nil {
		if errors.Is(err, errLeadershipLost) {
			// Not the global tier's failure: this replica's term ended
			// (lead logs it and any outage the term leaves open).
			l.s.log.Debug("region sync cut short: leadership lost", "region", l.s.opts.Region)
			return
		}
		l.s.metrics.globalSyncs.WithLabelValues("error").Inc()
		if l.syncDown.see(time.Now()) {
			msg := "region sync with the global tier failed; running on current grants (logged again when a sync succeeds)"
			if errors.As(err, new(ownRedisError)) {
				// No report left: the global tier is not at fault.
				msg = "region sync with the global tier not sent: this region's Redis fails (its clock, candidates or key states); running on current grants (logged again when a sync succeeds)"
			}
			l.s.log.Warn(msg, "region", l.s.opts.Region, "err", err)
		} else {
			l.s.log.Debug("region sync with the global tier failed again", "region", l.s.opts.Region, "err", err)
		}
		if _, err := l.NoGlobalLeader(ctx); err != nil {
			l.s.log.Debug("static lease: the global election could not be read", "err", err)
		}
		return
	}
	l.s.metrics.globalSyncs.WithLabelValues("ok").Inc()
	now := time.Now()
	if lasted, n, ok := l.syncDown.end(now); ok {
		l.s.log.Info("region sync with the global tier succeeds again", "region", l.s.opts.Region,
			"failing_for", lasted.Round(time.Millisecond), "failed_rounds", n)
	}
	for i := range l.extended {
		l.extensionsOver(now, i, "the global tier answers")
	}
}

// extensionsOver ends shard i's run of static lease extensions by the etcd
// rule (logged when one was under way), for the reason given.
func (l *Leader) extensionsOver(now time.Time, i int, why string) {
	o := l.extended[i]
	if o == nil {
		return
	}
	if lasted, n, ok := o.end(now); ok {
		l.s.log.Info("static lease no longer extended by the etcd rule: "+why, "region", l.s.opts.Region, "shard", i,
			"extended_for", lasted.Round(time.Millisecond), "extensions", n)
	}
	delete(l.extended, i)
}

func (l *Leader) setLeading(v bool) {
	l.isLeading.Store(v)
	if v {
		l.s.metrics.leader.Set(1)
	} else {
		l.s.metrics.leader.Set(0)
	}
	select {
	case <-l.leading:
	default:
	}
	l.leading <- v
}

// SyncOnce is one epoch's round of reports (regionsync.Round): a report
// of the keys that need the global tier (candidates.go), its grants
// installed, then an acknowledgement at
// once when the answer lowered a key's rate below what the region held,
// and catch-up reports while the answer says a raise waits on other
// regions (at most regionsync.MaxCatchUps). The grants' validity is
// converted to Redis time from the moment the report was sent (Redis TIME
// read before sending), so the region's view of every grant ends no later
// than the allocator's. lost, when it closes, means leadership ended:
// nothing more is written.
func (l *Leader) SyncOnce(ctx context.Context, lost <-chan struct{}) error {
	return l.syncRound(ctx, lost, nil, regionsync.Epoch)
}

// syncRound is SyncOnce starting with a report of the given kind. A nudge
// (from nudges, nil for none) that comes while the round waits to report
// again for a raise sends that report at once and is spent on it: the
// global leader nudges a region whose raise another region's
// acknowledgement just made possible (pkg/hierarchy, nudge.go), and the
// wait (the answer's report_again_ms) only guesses when that will be.
// MaxCatchUps still bounds the round's reports.
func (l *Leader) syncRound(ctx context.Context, lost <-chan struct{}, nudges <-chan struct{}, kind regionsync.Kind) error {
	epoch := time.Duration(l.s.opts.Config.Current().Epoch)
	round := regionsync.NewRound(epoch)
	if kind == regionsync.Nudged {
		round = regionsync.NewNudgedRound(epoch)
	}
	for {
		a, err := l.syncOnce(ctx, lost, kind)
		if err != nil {
			return err
		}
		next, wait, more := round.Next(a)
		if !more {
			return nil
		}
		if wait > 0 && !waitToReport(ctx, lost, nudges, wait) {
			return nil
		}
		kind = next
	}
}

// waitToReport waits wait before a round's next report, or until a nudge
// comes (spent on that report; nudges nil: none), and reports whether to
// send it: false when ctx ends or leadership is lost (lost closed).
func waitToReport(ctx context.Context, lost, nudges <-chan struct{}, wait time.Duration) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-lost:
		return false
	case <-nudges:
		return true
	case <-t.C:
		return true
	}
}

// syncOnce is one report of the given kind and its answer.
func (l *Leader) syncOnce(ctx context.Context, lost <-chan struct{}, kind regionsync.Kind) (regionsync.Answer, error) {
	s := l.s
	cfg := s.opts.Config.Current()
	epoch := time.Duration(cfg.Epoch)
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, epoch)
	defer cancel()
	// Redis TIME and the stored static lease in one round trip: a new
	// leader takes over its predecessor's lease before its first report.
	start := time.Now()
	clock, err := l.loadStatic(ctx)
	s.observeOwn(parent, "time", start, err)
	if err != nil {
		return regionsync.Answer{}, ownRedisError{err}
	}
	sendUS := clock.RedisUS
	start = time.Now()
	keys, err := l.candidates(ctx, sendUS, epoch, kind)
	var report *sluicev1.RegionReport
	var plans map[quota.Key]keyPlan
	var held regionsync.Held
	if err == nil {
		report, plans, held, err = l.buildReport(ctx, cfg, keys, sendUS, kind)
	}
	s.observeOwn(parent, "state", start, err)
	if err != nil {
		return regionsync.Answer{}, ownRedisError{err}
	}
	// The config revisions whose static shares the region honours: marked
	// reported before the report leaves, so none is dropped before a
	// confirmation passes it.
	report.ConfigRevisions = s.reportedChain()
	s.metrics.reports.WithLabelValues(kind.String()).Inc()
	return l.syncShards(ctx, lost, cfg, report, plans, held, sendUS)
}

// buildReport reads the keys' states at nowUS and has regionsync build the
// report; it returns the keys' plans and the rate each held alongside.
func (l *Leader) buildReport(ctx context.Context, cfg *config.Config, keys []quota.Key, nowUS int64, kind regionsync.Kind) (*sluicev1.RegionReport, map[quota.Key]keyPlan, regionsync.Held, error) {
	plans, reads, err := l.readKeys(ctx, cfg, keys)
	if err != nil {
		return nil, nil, nil, err
	}
	if on := l.opts.OnHeld; on != nil {
		for _, r := range reads {
			if st := r.State; st.GrantExpiryUS > 0 {
				on(r.Key, st.Rate, st.Cap, st.GrantExpiryUS)
			}
		}
	}
	rep, held := l.sync.Report(l.s.opts.Region, nowUS, time.Duration(cfg.Epoch), kind, reads)
	if kind == regionsync.Epoch {
		l.s.metrics.reportKeys.Set(float64(len(rep.GetKeys())))
	}
	return rep, plans, held, nil
}

// moved reads the states of the watched keys and of the fresh ones (newly
// marked candidates, freshKeys) and says whether one rose, or a granted
// one fell, enough to report now (regionsync.Leader.Moved).
func (l *Leader) moved(ctx context.Context) (rose, fell bool) {
	cfg := l.s.opts.Config.Current()
	epoch := time.Duration(cfg.Epoch)
	ctx, cancel := context.WithTimeout(ctx, regionsync.NudgeSpacing(epoch))
	defer cancel()
	keys := append(l.sync.Watched(), l.freshKeys(ctx, epoch)...)
	if len(keys) == 0 {
		return false, false
	}
	_, reads, err := l.readKeys(ctx, cfg, keys)
	if err != nil {
		return false, false // the next epoch reports anyway
	}
	return l.sync.Moved(time.Duration(cfg.Epoch), reads)
}

// readKeys reads the state of keys (those of a class still configured) in
// one pipeline.
func (l *Leader) readKeys(ctx context.Context, cfg *config.Config, keys []quota.Key) (map[quota.Key]keyPlan, []regionsync.KeyRead, error) {
	s := l.s
	plans := make(map[quota.Key]keyPlan, len(keys))
	var ordered []keyPlan
	for _, k := range keys {
		p, err := s.plan(cfg, &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, "key")
		if err != nil {
			continue // a class removed from the config: nothing to report
		}
		plans[k] = p
		ordered = append(ordered, p)
	}
	// Batched: one script call per up to luascripts.BatchKeys keys of a
	// slot, so the script's fixed cost is paid per batch, not per key.
	items := make([]luascripts.KeyCommon, len(ordered))
	for i, p := range ordered {
		items[i] = luascripts.KeyCommon{Keys: p.keys, Common: p.common}
	}
	res := s.scripts.StateMany(ctx, s.opts.Redis, items)
	for _, r := range res {
		// Reads reap expired leases too: what they return is reclaimed.
		if r.Err == nil && r.State.Reclaimed > 0 {
			s.metrics.reclaimed.Add(float64(r.State.Reclaimed))
		}
		if r.Err == nil {
			s.metrics.burstReleased.Add(r.State.Released)
		}
	}
	reads := make([]regionsync.KeyRead, len(ordered))
	for i, p := range ordered {
		if res[i].Err != nil {
			return nil, nil, res[i].Err
		}
		reads[i] = regionsync.KeyRead{Key: p.key, State: res[i].State, StaticRate: p.common.StaticRate}
		p.readUS = res[i].State.NowUS
		plans[p.key] = p
	}
	return plans, reads, nil
}

// install runs the set_rate calls regionsync derives from the answer.
func (l *Leader) install(ctx context.Context, cfg *config.Config, g *sluicev1.RegionGrants, plans map[quota.Key]keyPlan, held regionsync.Held, sendUS int64) (regionsync.Answer, error) {
	s := l.s
	installs, refused := regionsync.Installs(g, sendUS, held)
	for _, r := range refused {
		s.log.Warn("global tier sent an invalid grant; ignored", "grant", r.Grant.String(), "reason", r.Reason)
	}
	for i := range installs {
		if p, reported := plans[installs[i].Key]; reported {
			installs[i].ReadAt(p.readUS)
		}
	}
	type item struct {
		p  keyPlan
		in int // index in installs
	}
	var items []item
	for i, in := range installs {
		// Planned afresh: the plan of the key's state read chose its
		// static share and deadline before the global round trip.
		p, err := s.plan(cfg, in.Wire, "grant.key")
		if err != nil {
			_, reported := plans[in.Key]
			_, configured := cfg.Classes[in.Key.Class]
			switch {
			case reported:
				s.log.Warn("planning a granted key failed; not installed", "err", err)
			case !configured:
				// A class this region's config no longer has: the global
				// tier grants it until it confirms the revision that
				// removed it, a config change like any other.
				if ok, left := l.ignoredGrants.Allow("class "+in.Key.Class, time.Now()); ok {
					s.log.Info("global tier granted a key of a class this region's config no longer has; ignored until the global tier runs that config too",
						"class", in.Key.Class, "key", in.Key.String(), "ignored_since_last_logged", left)
				}
			default:
				if ok, left := l.ignoredGrants.Allow("invalid", time.Now()); ok {
					s.log.Warn("global tier granted an invalid key; ignored", "err", err, "ignored_since_last_logged", left)
				}
			}
			continue
		}
		installs[i].FromStatic(p.common.StaticRate)
		items = append(items, item{p: p, in: i})
	}
	// set_rate marks each granted key a candidate until its grant ends:
	// the allocator needs the region to acknowledge what it holds before
	// it moves capacity elsewhere, even without local traffic.
	// Batched as the state reads are.
	batch := make([]luascripts.SetRateItem, len(items))
	for i, it := range items {
		in := installs[it.in]
		batch[i] = luascripts.SetRateItem{Keys: it.p.keys, Common: it.p.common, Rate: in.Rate, Burst: in.Burst,
			ExpiryUS: in.ExpiryUS, IssuedUS: in.FenceUS, Deposit: in.Deposit}
	}
	res := s.scripts.SetRateMany(ctx, s.opts.Redis, batch)
	var firstErr error
	applied := make([]bool, len(installs))
	for i, r := range res {
		sr, err := r.Reply, r.Err
		if err == nil && sr.Reclaimed > 0 {
			s.metrics.reclaimed.Add(float64(sr.Reclaimed))
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if err == nil && sr.Applied {
			in := &installs[items[i].in]
			applied[items[i].in] = true
			in.Released = sr.Released
			s.metrics.grantsApplied.Inc()
			s.metrics.burstReleased.Add(sr.Released)
			s.metrics.burstDeposited.Add(sr.Deposited)
			if l.opts.OnApplied != nil {
				l.opts.OnApplied(in.Key, in.Rate, in.Burst, in.ExpiryUS)
			}
		}
	}
	l.sync.Installed(installs, applied)
	return regionsync.Outcome(g, installs, applied), firstErr
}

// Leading reports leadership changes (true when elected, false when lost);
// it holds only the latest value.
func (l *Leader) Leading() <-chan bool { return l.leading }

// IsLeading reports whether this replica leads its region now. Safe for
// concurrent use.
func (l *Leader) IsLeading() bool { return l.isLeading.Load() }
