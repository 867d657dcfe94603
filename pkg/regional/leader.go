package regional

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/election"
	"github.com/sluicehq/sluice/internal/shrink"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// GlobalTier is how the region leader reaches the global allocator
// (allocator.Client follows the global leader).
type GlobalTier interface {
	Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error)
}

// LeaderOptions configure the region leader loop.
type LeaderOptions struct {
	// Etcd elects one leader per region. Required.
	Etcd *clientv3.Client
	// ElectionPrefix is where election keys live (config.Store's
	// ElectionPrefix, "<prefix>/election/"). Required.
	ElectionPrefix string
	// Global is the global tier. Required.
	Global GlobalTier
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
}

// Leader is the region leader loop's state. Only Run's goroutine uses the
// unexported fields.
type Leader struct {
	s    *Server
	opts LeaderOptions

	last     map[quota.Key]luascripts.State // each key's state at the previous report
	lastPeak shrink.Peak                    // last's high-water mark
	seq      uint64

	// leading is observed by tests and metrics.
	leading chan bool
	// isLeading is set while this replica leads its region.
	isLeading atomic.Bool
}

// NewLeader prepares the region leader loop of s.
func NewLeader(s *Server, o LeaderOptions) (*Leader, error) {
	if o.Etcd == nil || o.Global == nil || o.ElectionPrefix == "" || o.Identity == "" {
		return nil, errors.New("regional: leader needs Etcd, Global, ElectionPrefix and Identity")
	}
	if o.SessionTTL == 0 {
		o.SessionTTL = 5 * time.Second
	}
	return &Leader{s: s, opts: o, last: map[quota.Key]luascripts.State{}, leading: make(chan bool, 1)}, nil
}

// Run campaigns for the region's leadership and, while leading, syncs with
// the global tier every epoch. It returns when ctx ends. Replicas that are
// not leader keep serving leases; only the leader talks to the global tier.
func (l *Leader) Run(ctx context.Context) error {
	key := l.opts.ElectionPrefix + "region/" + l.s.opts.Region
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
	l.s.log.Info("region leader elected", "region", l.s.opts.Region, "identity", l.opts.Identity)
	l.setLeading(true)
	defer l.setLeading(false)
	// A new leader starts its demand baseline afresh: the first report of
	// a key after a leader change carries no admitted/denied counts.
	clear(l.last)
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		el.Resign(rctx)
		cancel()
	}()
	epoch := time.Duration(l.s.opts.Config.Current().Epoch)
	t := time.NewTicker(epoch)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sess.Done():
			return errors.New("etcd session expired")
		case <-t.C:
			if err := l.SyncOnce(ctx, sess.Done()); err != nil {
				l.s.metrics.globalSyncs.WithLabelValues("error").Inc()
				l.s.log.Warn("region sync with the global tier failed; running on current grants", "err", err)
			} else {
				l.s.metrics.globalSyncs.WithLabelValues("ok").Inc()
			}
			if e := time.Duration(l.s.opts.Config.Current().Epoch); e != epoch {
				epoch = e
				t.Reset(epoch)
			}
		}
	}
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

// SyncOnce sends one report for every active key and installs the grants.
// The grants' validity is converted to Redis time from the moment the
// report was sent (Redis TIME read before sending), so the region's view
// of every grant ends no later than the allocator's. lost, when it closes,
// means leadership ended: nothing more is written.
//
// When the answer lowers some key's rate below what the region held, it
// reports again at once: the allocator gives the capacity to other regions
// only once this region acknowledged the smaller grant, and waiting for
// the next epoch would cost them one. When the answer says a raise waits
// on other regions' acknowledgements (report_again_ms), it reports again
// after that delay, at most MaxCatchUps times, so the recipient need not
// wait for its next epoch either. These extra reports keep the demand
// baseline, so their windows are too short to count as demand, and an
// extra report never triggers an acknowledgement of its own. With many
// keys some grant falls in most epochs, so expect close to two reports per
// epoch, and up to two more while capacity moves towards this region.
func (l *Leader) SyncOnce(ctx context.Context, lost <-chan struct{}) error {
	res, err := l.syncOnce(ctx, lost, reportEpoch)
	if err != nil {
		return err
	}
	if res.lowered {
		if res, err = l.syncOnce(ctx, lost, reportAck); err != nil {
			return err
		}
	}
	epoch := time.Duration(l.s.opts.Config.Current().Epoch)
	for range MaxCatchUps {
		if res.again <= 0 {
			return nil
		}
		t := time.NewTimer(min(res.again, epoch))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-lost:
			t.Stop()
			return nil
		case <-t.C:
		}
		if res, err = l.syncOnce(ctx, lost, reportCatchUp); err != nil {
			return err
		}
	}
	return nil
}

// Report kinds (the reports metric's label). Only epoch reports move the
// demand baseline.
const (
	reportEpoch   = "epoch"
	reportAck     = "ack"
	reportCatchUp = "catch_up"
)

// MaxCatchUps bounds the catch-up reports one epoch makes for a pending
// raise.
const MaxCatchUps = 2

// syncResult is what one report's answer asks of the region.
type syncResult struct {
	lowered bool          // an applied grant lowered a key's rate: acknowledge
	again   time.Duration // > 0: a raise is pending; report again after it
}

// syncOnce is one report of the given kind and its answer.
func (l *Leader) syncOnce(ctx context.Context, lost <-chan struct{}, kind string) (syncResult, error) {
	s := l.s
	cfg := s.opts.Config.Current()
	epoch := time.Duration(cfg.Epoch)
	ctx, cancel := context.WithTimeout(ctx, epoch)
	defer cancel()
	sendTime, err := s.opts.Redis.Time(ctx).Result()
	if err != nil {
		return syncResult{}, fmt.Errorf("redis time: %w", err)
	}
	sendUS := sendTime.UnixMicro()
	keys, err := ActiveKeys(ctx, s.opts.Redis, s.opts.Prefix, sendUS-(3*epoch).Microseconds())
	if err != nil {
		return syncResult{}, err
	}
	report, plans, held, err := l.buildReport(ctx, cfg, keys, sendUS, kind != reportEpoch)
	if err != nil {
		return syncResult{}, err
	}
	s.metrics.reports.WithLabelValues(kind).Inc()
	grants, err := l.opts.Global.Sync(ctx, report)
	if err != nil {
		return syncResult{}, fmt.Errorf("global sync: %w", err)
	}
	select {
	case <-lost:
		return syncResult{}, errors.New("leadership lost before the grants were installed")
	default:
	}
	lowered, err := l.install(ctx, cfg, grants, plans, held, sendUS)
	return syncResult{lowered: lowered, again: time.Duration(grants.GetReportAgainMs()) * time.Millisecond}, err
}

// buildReport reads every key's state and returns the report, the keys'
// plans and the rate the region held for each at nowUS (its static share
// when no grant is valid). With keepBaseline (acknowledgements and
// catch-ups) the demand baseline stays where it was.
func (l *Leader) buildReport(ctx context.Context, cfg *config.Config, keys []quota.Key, nowUS int64, keepBaseline bool) (*sluicev1.RegionReport, map[quota.Key]keyPlan, map[quota.Key]float64, error) {
	s := l.s
	plans := make(map[quota.Key]keyPlan, len(keys))
	held := make(map[quota.Key]float64, len(keys))
	var ordered []keyPlan
	for _, k := range keys {
		p, err := s.plan(cfg, &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, "key")
		if err != nil {
			continue // a class removed from the config: nothing to report
		}
		plans[k] = p
		ordered = append(ordered, p)
	}
	qs := luascripts.RunQueued(ctx, s.opts.Redis, func(pipe redis.Pipeliner) []*luascripts.Queued {
		out := make([]*luascripts.Queued, len(ordered))
		for i, p := range ordered {
			out[i] = s.scripts.QueueState(ctx, pipe, p.keys, p.common)
		}
		return out
	})
	// Redis time as seq: strictly increasing across leader changes without
	// storing anything.
	l.seq = max(l.seq+1, uint64(nowUS))
	rep := &sluicev1.RegionReport{Region: s.opts.Region, Seq: l.seq}
	for i, p := range ordered {
		st, err := luascripts.ParseState(qs[i])
		if err != nil {
			return nil, nil, nil, err
		}
		prev, seen := l.last[p.key]
		if !keepBaseline {
			l.last[p.key] = st
		}
		kd := &sluicev1.KeyDemand{
			Key:     &sluicev1.QuotaKey{Tenant: p.key.Tenant, Class: p.key.Class},
			Holding: st.Holding(),
		}
		// The first sight of a key (after an election) is a baseline: a
		// 1 ms window with no counts, too short to count as demand.
		kd.WindowMs = 1
		if seen && st.NowUS > prev.NowUS {
			r := st.Since(prev)
			kd.Admitted, kd.Denied, kd.WindowMs = r.Admitted, r.Denied, r.Window.Milliseconds()
			kd.DemandRate = proto.Float64(r.DemandRate)
		}
		held[p.key] = p.common.StaticRate
		if st.GrantExpiryUS > 0 {
			kd.HeldRate, kd.HeldBurst = st.Rate, st.Cap
			kd.HeldValidMs = (st.GrantExpiryUS - st.NowUS) / 1000
			held[p.key] = st.Rate
		}
		rep.Keys = append(rep.Keys, kd)
	}
	if !keepBaseline {
		l.forgetBaselines(plans)
	}
	return rep, plans, held, nil
}

// forgetBaselines drops the demand baseline of every key this epoch's
// report left out: no replica served it and the region held no grant for
// it for the index's window, so it is idle, and should it come back its
// first report is a baseline again, as after an election. The baselines
// are thus bounded by the keys of one report.
func (l *Leader) forgetBaselines(reported map[quota.Key]keyPlan) {
	l.lastPeak.Note(len(l.last))
	for k := range l.last {
		if _, ok := reported[k]; !ok {
			delete(l.last, k)
		}
	}
	l.last = shrink.Map(l.last, &l.lastPeak)
}

// install applies the grants and reports whether an applied one lowered
// a reported key's rate below what the region held when it reported.
func (l *Leader) install(ctx context.Context, cfg *config.Config, g *sluicev1.RegionGrants, plans map[quota.Key]keyPlan, held map[quota.Key]float64, sendUS int64) (bool, error) {
	s := l.s
	type item struct {
		p           keyPlan
		rate, burst float64
		expiryUS    int64
		lowers      bool
	}
	var items []item
	for _, kg := range g.GetGrants() {
		k := quota.Key{Tenant: kg.GetKey().GetTenant(), Class: kg.GetKey().GetClass()}
		p, reported := plans[k]
		if !reported {
			var err error
			if p, err = s.plan(cfg, kg.GetKey(), "grant.key"); err != nil {
				s.log.Warn("global tier granted an invalid key; ignored", "err", err)
				continue
			}
		}
		if !(kg.GetRate() >= 0) || !(kg.GetBurst() >= 0) || math.IsInf(kg.GetRate(), 0) || math.IsInf(kg.GetBurst(), 0) || kg.GetValidMs() <= 0 {
			s.log.Warn("global tier sent an invalid grant; ignored", "key", k, "rate", kg.GetRate(), "burst", kg.GetBurst(), "valid_ms", kg.GetValidMs())
			continue
		}
		items = append(items, item{p: p, rate: kg.GetRate(), burst: kg.GetBurst(), expiryUS: sendUS + kg.GetValidMs()*1000,
			lowers: reported && kg.GetRate() < held[k]})
	}
	qs := luascripts.RunQueued(ctx, s.opts.Redis, func(pipe redis.Pipeliner) []*luascripts.Queued {
		out := make([]*luascripts.Queued, len(items))
		granted := make([]redis.Z, len(items))
		for i, it := range items {
			out[i] = s.scripts.QueueSetRate(ctx, pipe, it.p.keys, it.p.common, it.rate, it.burst, it.expiryUS, sendUS)
			granted[i] = redis.Z{Score: float64(sendUS), Member: it.p.key.Tenant + "|" + it.p.key.Class}
		}
		// A granted key is reported in the next epochs even without local
		// traffic: the allocator needs the region to acknowledge what it
		// holds before it moves capacity elsewhere.
		if len(granted) > 0 {
			pipe.ZAdd(ctx, s.opts.Prefix+"active", granted...)
		}
		return out
	})
	var firstErr error
	lowered := false
	for i, q := range qs {
		sr, err := luascripts.ParseSetRate(q)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if err == nil && sr.Applied {
			s.metrics.grantsApplied.Inc()
			lowered = lowered || items[i].lowers
			if l.opts.OnApplied != nil {
				it := items[i]
				l.opts.OnApplied(it.p.key, it.rate, it.burst, it.expiryUS)
			}
		}
	}
	return lowered, firstErr
}

// Leading reports leadership changes (true when elected, false when lost);
// it holds only the latest value.
func (l *Leader) Leading() <-chan bool { return l.leading }

// IsLeading reports whether this replica leads its region now. Safe for
// concurrent use.
func (l *Leader) IsLeading() bool { return l.isLeading.Load() }
