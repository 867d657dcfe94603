package live

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/internal/redisproc"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/sim/engine"
	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/runner"
	"github.com/sluicehq/sluice/sim/scenario"
	"github.com/sluicehq/sluice/sim/traffic"
)

// DefaultScale is how many scenario seconds one wall second plays.
const DefaultScale = 1.0

// etcdPrefix keeps the simulation's keys apart in the embedded etcd.
const etcdPrefix = "/sluice-sim"

// Options adjust a live run.
type Options struct {
	runner.Options
	// Scale is scenario seconds per wall second. Optional, default 1;
	// bounded by the config's epoch, which must stay at least 10ms.
	Scale float64
	// Log receives progress lines and warnings. Optional.
	Log io.Writer
	// DaemonLog receives the daemons' own structured logs (leader
	// elections, failed syncs). Optional, default discarded.
	DaemonLog io.Writer

	// beforeDelivery, when set, runs on the driving goroutine before each
	// batch is delivered, with the batch's planned scenario time: the
	// package's tests stall the driver with it, as a starved machine
	// would.
	beforeDelivery func(planned time.Duration)
}

// Run plays sc against real daemons and judges it with the oracle.
func Run(ctx context.Context, sc *scenario.Scenario, o Options) (*runner.Outcome, error) {
	wallStart := time.Now()
	scale := o.Scale
	if scale == 0 {
		scale = DefaultScale
	}
	if !(scale > 0) || math.IsInf(scale, 0) {
		return nil, fmt.Errorf("live: scale %v must be a positive number", scale)
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.DaemonLog == nil {
		o.DaemonLog = io.Discard
	}
	// What live mode does not play is no change for the recovered
	// measures: it has no recovery to measure.
	o.Options.Skipped = Skipped
	setup, err := runner.NewSetup(sc, o.Options)
	if err != nil {
		return nil, err
	}
	sc, seed, plan, orc := setup.Scenario, setup.Seed, setup.Plan, setup.Oracle
	cfg, err := scaleConfig(sc.Config, scale)
	if err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	d := &deployment{sc: sc, cfg: cfg, scale: scale, log: o.Log, plan: plan, seed: seed, beforeDelivery: o.beforeDelivery,
		logger: slog.New(slog.NewTextHandler(o.DaemonLog, nil)), keyID: map[quota.Key]int{}}
	d.replayCtx, d.stopReplays = context.WithCancel(context.Background())
	for i, k := range plan.Keys {
		d.keyID[k] = i
		d.rkeys = append(d.rkeys, luascripts.KeysFor(luascripts.DefaultPrefix, k))
	}
	defer d.close()
	if err := d.start(ctx); err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	d.startRecording(&recorder{orc: orc, start: time.Now(), scale: scale})
	fmt.Fprintf(o.Log, "live: %s running for %v (%v of scenario time at scale %v)\n",
		sc.Name, time.Duration(float64(sc.Duration)/scale).Round(time.Millisecond), time.Duration(sc.Duration), scale)
	if err := d.play(ctx); err != nil {
		return nil, fmt.Errorf("live: %w", err)
	}
	d.countRPCs()
	var res *oracle.Result
	d.rec.finish(func(o *oracle.Oracle, _ time.Duration) { res = o.Finish(time.Duration(sc.Duration)) })
	out := setup.Outcome("live", res)
	d.dumpViolation(o.Log, "2 (Σ regional rates <= r)", res.Rates)
	d.dumpViolation(o.Log, "3 (Σ regional caps <= b)", res.Bursts)
	out.Counters.Events = uint64(d.decisions.Load())
	for _, r := range d.regions {
		out.Counters.Replays += r.lease.replays.Load() + r.faults.replays.Load()
		out.Counters.ReplayMismatches += r.faults.mismatches.Load()
		r.faults.mu.Lock()
		if m := r.faults.firstMismatch; m != "" {
			fmt.Fprintf(o.Log, "live: %s's report delivered again was answered differently:\n%s\n", r.name, m)
		}
		r.faults.mu.Unlock()
		out.Counters.LostAnswers += r.lease.lost.Load()
	}
	out.CheckReplays()
	if c := out.Counters; c.LostAnswers > 0 || c.Replays > 0 {
		fmt.Fprintf(o.Log, "live: %d lease answers lost after the request applied, %d requests and reports delivered again (%d region reports answered differently)\n",
			c.LostAnswers, c.Replays, c.ReplayMismatches)
	}
	out.Warnings = d.pace.warnings()
	for _, w := range out.Warnings {
		fmt.Fprintf(o.Log, "live: WARNING: %s\n", w)
	}
	out.Wall = time.Since(wallStart)
	return out, nil
}

// deployment is everything one live run starts.
type deployment struct {
	sc     *scenario.Scenario
	cfg    *config.Config
	scale  float64
	seed   uint64
	log    io.Writer
	logger *slog.Logger
	plan   *traffic.Plan
	keyID  map[quota.Key]int
	rkeys  []luascripts.Keys
	rec    *recorder // set by startRecording; guarded by grantMu until then
	// regionIdx is each region's index in the oracle, by name.
	regionIdx map[string]int
	// tiers counts the ways to the global tier each region's replicas
	// opened (one per process and shard), numbering them for the trace.
	tiersMu sync.Mutex
	tiers   map[string]int // guarded by tiersMu
	// beforeDelivery is Options.beforeDelivery.
	beforeDelivery func(planned time.Duration)

	grantMu sync.Mutex            // guards rec while it is nil, early, byReplica, replicaRegion, told and staticEnd
	early   map[[2]int]earlyGrant // grants applied before recording began
	// seen is the grant each (region, key) was last known to hold: applied
	// (OnApplied) or found held by a report's state read (grantHeld).
	// Guarded by grantMu.
	seen map[[2]int]earlyGrant
	// staticEnd is, by region index, the largest end of its static lease
	// its leaders stored (Redis time, µs; static.go).
	staticEnd map[int]int64
	// byReplica is each regional replica's static shares (events.go), by
	// its devcluster number, replicaRegion its region; told is what the oracle was
	// last told of each region's (the largest over its replicas).
	byReplica     map[int][]keyShare
	replicaRegion map[int]string
	told          map[string][]keyShare

	c       *devcluster.Cluster
	regions []*liveRegion
	// globalHome is the region each of c.Global runs in (placeGlobals).
	globalHome []string

	globalMu sync.Mutex          // guards globals
	globals  []*allocator.Daemon // every global daemon started, for their metrics

	decisions atomic.Int64
	pace      pace // written by the driving goroutine only (drive)
	workers   sync.WaitGroup
	// faultJobs counts fault actions still to run or running (a delayed
	// restart, a replacement replica); play waits for them.
	faultJobs sync.WaitGroup
	// replayCtx ends the lease requests delivered again (leasefaults.go)
	// when the traffic stops; close waits for replayJobs once no instance
	// calls any more.
	replayCtx   context.Context
	stopReplays context.CancelFunc
	replayJobs  sync.WaitGroup

	// trace is every key's latest grant events, printed for the first
	// key that breaks invariant 2 or 3.
	trace keyTrace
}

type liveRegion struct {
	idx    int
	name   string
	redis  *redisproc.Proc
	rdb    *redis.Client // for reading grants
	faults *tierFaults   // between the region and the global tier
	lease  *leaseFaults  // between the region's instances and its service
	// replicas serve the region; instances dial them all, round robin.
	replicas []*devcluster.RegionalReplica

	mu      sync.Mutex         // guards daemons, insts, all, vers, nextNum
	daemons []*regional.Daemon // every one started, for their metrics
	insts   []*liveInstance    // serving
	all     []*liveInstance    // ever started
	vers    int
	nextNum int
}

func (r *liveRegion) allInstances() []*liveInstance {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*liveInstance(nil), r.all...)
}

// remove takes an instance out of the load balancer.
func (r *liveRegion) remove(in *liveInstance) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, x := range r.insts {
		if x == in {
			r.insts = append(r.insts[:i], r.insts[i+1:]...)
			r.vers++
			return
		}
	}
}

type liveInstance struct {
	id     string
	num    int
	region *liveRegion
	conn   *grpc.ClientConn
	client *lease.Client
	reqs   chan request
	dead   atomic.Bool
	closer sync.Once // closes reqs
	// serving is held while a request is decided: a graceful stop waits
	// for the one in flight before it closes the client, as the agent
	// does (agent.Stop), instead of answering it ErrClosed.
	serving sync.Mutex
	// isolated cuts the instance off from its region (isolate.go).
	isolated atomic.Bool

	mu   sync.Mutex // guards used
	used map[int]bool
}

type request struct {
	key  int
	n    int64
	cost int64
}

// start brings the deployment up on internal/devcluster — etcd, the
// global replicas (a standby when the scenario has one), a Redis and
// replicasPerRegion regional replicas per region, all on the scaled config
// — then the instances.
func (d *deployment) start(ctx context.Context) error {
	globals := 1
	if d.sc.Topology.Global.Standby != "" {
		globals = 2
	}
	var names []string
	idx := map[string]int{}
	faults := map[string]*tierFaults{}
	for i, rs := range d.sc.Topology.Regions {
		names = append(names, rs.Name)
		idx[rs.Name] = i
		faults[rs.Name] = &tierFaults{rng: engine.NewStream(d.seed, "live-tier/"+rs.Name)}
	}
	d.regionIdx = idx
	d.tiers = map[string]int{}
	c, err := devcluster.Start(ctx, devcluster.Options{
		Config: d.cfg, Regions: names, ReplicasPerRegion: replicasPerRegion, GlobalReplicas: globals,
		SessionTTL: sessionTTL(time.Duration(d.sc.Topology.SessionTTL), d.scale), Prefix: etcdPrefix,
		// Operator events are config revisions written to etcd: the
		// daemons watch it for them, as in production. Without events a
		// static config spares each replica its watch.
		StaticConfig: len(d.sc.Events) == 0, ConservativeColdStart: d.sc.Topology.ColdStart == "conservative",
		OnChain:            d.chainStored,
		OnStaticLease:      d.staticStored,
		AllowEmbeddedRedis: true, Logger: d.logger,
		WrapGlobal: func(region string, next regional.GlobalTier) regional.GlobalTier {
			// Each replica process (and each shard's tier of it) wraps
			// its own way to the global tier: the trace names which.
			d.tiersMu.Lock()
			d.tiers[region]++
			tier := d.tiers[region]
			d.tiersMu.Unlock()
			return &faultyTier{next: next, f: faults[region],
				sending: func(r *sluicev1.RegionReport) { d.traceReport(idx[region], tier, r) },
				answered: func(r *sluicev1.RegionReport, g *sluicev1.RegionGrants, err error) {
					d.traceAnswer(idx[region], tier, r, g, err)
				}}
		},
		OnApplied: func(region string, k quota.Key, rate, burst float64, expiryUS int64) {
			if key, ok := d.keyID[k]; ok {
				d.grantApplied(idx[region], key, rate, burst, expiryUS)
			}
		},
		OnHeld: func(region string, k quota.Key, rate, burst float64, expiryUS int64) {
			if key, ok := d.keyID[k]; ok {
				d.grantHeld(idx[region], key, rate, burst, expiryUS)
			}
		},
	})
	if err != nil {
		return err
	}
	d.c = c
	for _, g := range c.Global {
		d.addGlobal(g.Daemon())
	}
	d.globalHome = d.placeGlobals(ctx)
	warned := false
	for i, name := range names {
		cr := c.Regions[name]
		if cr.Redis.Embedded() && !warned {
			fmt.Fprintln(d.log, "live: WARNING: redis-server is not installed; using an embedded Redis (miniredis), which is not the production server")
			warned = true
		}
		r := &liveRegion{idx: i, name: name, redis: cr.Redis, faults: faults[name], replicas: cr.Replicas,
			lease: &leaseFaults{rng: engine.NewStream(d.seed, "live-lease/"+name)},
			rdb:   redis.NewClient(&redis.Options{Addr: cr.Redis.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})}
		for _, rep := range cr.Replicas {
			r.daemons = append(r.daemons, rep.Daemon())
		}
		d.regions = append(d.regions, r)
		for j := 0; j < d.sc.Topology.Regions[i].Instances; j++ {
			if _, err := d.startInstance(r); err != nil {
				return err
			}
		}
	}
	return nil
}

// placeGlobals says which region each global replica runs in: the first
// to lead runs in the topology's primary region, the other in its
// standby's, as virtual mode starts them (a replica's region is kept
// through leader changes; a region-down kills the replica there). Both
// replicas campaign at once, so which one leads is only known once one
// does: it waits for a leader, polling once per epoch, at most several
// session TTLs; without one by then, the replicas are taken in order.
func (d *deployment) placeGlobals(ctx context.Context) []string {
	homes := []string{d.sc.Topology.Global.Primary, d.sc.Topology.Global.Standby}[:len(d.c.Global)]
	if len(homes) < 2 {
		return homes
	}
	ttl := sessionTTL(time.Duration(d.sc.Topology.SessionTTL), d.scale)
	deadline := time.Now().Add(10 * ttl)
	tick := time.NewTicker(time.Duration(d.cfg.Epoch))
	defer tick.Stop()
	for {
		for i, g := range d.c.Global {
			if dm := g.Daemon(); dm != nil && dm.IsLeader() {
				if i != 0 {
					homes[0], homes[i] = homes[i], homes[0]
				}
				return homes
			}
		}
		if !time.Now().Before(deadline) {
			return homes
		}
		select {
		case <-ctx.Done():
			return homes
		case <-tick.C:
		}
	}
}

func (d *deployment) startInstance(r *liveRegion) (*liveInstance, error) {
	r.mu.Lock()
	num := r.nextNum
	r.nextNum++
	r.mu.Unlock()
	in := &liveInstance{id: fmt.Sprintf("%s-%d", r.name, num), num: num, region: r,
		reqs: make(chan request, 1<<14), used: map[int]bool{}}
	conn, err := dialRegion(r, grpc.WithChainUnaryInterceptor(r.lease.intercept(d, &in.isolated)))
	if err != nil {
		return nil, fmt.Errorf("dial region %s: %w", r.name, err)
	}
	classes := map[string]lease.ClassPolicy{}
	for name, cl := range d.cfg.Classes {
		m, _ := lease.ParseMode(string(cl.Mode))
		p, _ := lease.ParsePolicy(string(cl.OnFailure))
		classes[name] = lease.ClassPolicy{Mode: m, OnFailure: p}
	}
	in.conn = conn
	opts := lease.Options{InstanceID: in.id, Refresh: time.Duration(d.cfg.Refresh), Classes: classes, Logger: d.logger}
	if v := time.Duration(d.sc.Client.BreakerTimeout); v > 0 {
		opts.BreakerTimeout = v
	}
	if d.sc.Client.BreakerFailures > 0 {
		opts.BreakerFailures = d.sc.Client.BreakerFailures
	}
	if v := time.Duration(d.sc.Client.BreakerCooldown); v > 0 {
		opts.BreakerCooldown = time.Duration(float64(v) / d.scale)
	}
	if in.client, err = lease.NewClient(conn, opts); err != nil {
		conn.Close()
		return nil, err
	}
	d.workers.Add(1)
	go d.work(in)
	r.mu.Lock()
	r.insts = append(r.insts, in)
	r.all = append(r.all, in)
	r.vers++
	r.mu.Unlock()
	return in, nil
}

// work decides an instance's requests with its lease client.
func (d *deployment) work(in *liveInstance) {
	defer d.workers.Done()
	ctx := context.Background()
	for req := range in.reqs {
		in.serving.Lock()
		if in.dead.Load() {
			in.serving.Unlock()
			continue
		}
		k := d.plan.Keys[req.key]
		strict := d.cfg.Classes[k.Class].Mode == config.ModeStrict
		var adm, den, deg, shadow int64
		for i := int64(0); i < req.n; i++ {
			dec, err := in.client.Allow(ctx, k, req.cost)
			switch {
			case err != nil || !dec.Allowed:
				den += req.cost
			case dec.WouldDeny:
				shadow += req.cost
			case dec.Degraded:
				deg += req.cost
			default:
				adm += req.cost
			}
		}
		in.serving.Unlock()
		d.decisions.Add(req.n)
		src := oracle.SourceLease
		if strict {
			src = oracle.SourceStrict
		}
		r := in.region.idx
		d.rec.do(func(o *oracle.Oracle, now time.Duration) {
			for _, x := range []struct {
				v int64
				s oracle.Source
			}{{adm, src}, {deg, oracle.SourceDegraded}, {shadow, oracle.SourceShadow}, {den, oracle.SourceDenied}} {
				if x.v > 0 {
					o.Decided(now, r, req.key, x.v, x.s)
				}
			}
		})
	}
}

// wallAt is the wall-clock instant of scenario time v.
func (d *deployment) wallAt(v time.Duration) time.Time {
	return d.rec.start.Add(time.Duration(float64(v) / d.scale))
}

func sleepUntil(ctx context.Context, at time.Time) error {
	wait := time.Until(at)
	if wait <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// play drives traffic, faults and the grant poller for the scenario's
// duration.
func (d *deployment) play(parent context.Context) error {
	dur := time.Duration(d.sc.Duration)
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var bg sync.WaitGroup
	for _, f := range d.sc.Schedule(d.seed) {
		bg.Add(1)
		go func() {
			defer bg.Done()
			if sleepUntil(ctx, d.wallAt(time.Duration(f.At))) == nil {
				d.inject(ctx, f)
			}
		}()
	}
	if len(d.sc.Events) > 0 {
		bg.Add(1)
		go func() {
			defer bg.Done()
			d.playEvents(ctx)
		}()
	}
	bg.Add(1)
	go func() {
		defer bg.Done()
		// The oracle's timers (grant expiries, windows) need a clock even
		// when nothing is observed.
		t := time.NewTicker(time.Duration(d.cfg.Epoch))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.Advance(now) })
			}
		}
	}()
	err := d.drive(ctx, dur)
	cancel()
	d.stopReplays()
	bg.Wait()
	d.faultJobs.Wait()
	d.stopWorkers()
	if err := parent.Err(); err != nil {
		return err
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

type batch struct {
	end    time.Duration
	n      int64
	stream int
}

type batchHeap []batch

func (h batchHeap) Len() int { return len(h) }
func (h batchHeap) Less(i, j int) bool {
	if h[i].end != h[j].end {
		return h[i].end < h[j].end
	}
	return h[i].stream < h[j].stream
}
func (h batchHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *batchHeap) Push(x any)   { *h = append(*h, x.(batch)) }
func (h *batchHeap) Pop() any {
	old := *h
	b := old[len(old)-1]
	*h = old[:len(old)-1]
	return b
}

// drive delivers every stream's batches at their wall-clock times.
func (d *deployment) drive(ctx context.Context, dur time.Duration) error {
	h := &batchHeap{}
	for i, st := range d.plan.Streams {
		end, n := st.Next(0)
		heap.Push(h, batch{end: end, n: n, stream: i})
	}
	routes := make([]route, len(d.plan.Streams))
	for h.Len() > 0 {
		b := heap.Pop(h).(batch)
		if b.end > dur {
			continue
		}
		if err := sleepUntil(ctx, d.wallAt(b.end)); err != nil {
			return err
		}
		st := d.plan.Streams[b.stream]
		if b.n > 0 {
			if d.beforeDelivery != nil {
				d.beforeDelivery(b.end)
			}
			d.pace.delivered(b.end, d.rec.virtual(time.Now()), b.n)
			d.deliver(st, &routes[b.stream], b.stream, b.n)
		}
		if b.end < dur {
			end, n := st.Next(b.end)
			heap.Push(h, batch{end: end, n: n, stream: b.stream})
		}
	}
	return sleepUntil(ctx, d.wallAt(dur))
}

type route struct {
	vers, spread int
	chosen       []*liveInstance
	next         int
}

func (d *deployment) deliver(st *traffic.Stream, rt *route, id int, n int64) {
	k := d.keyID[st.Key]
	r := d.regions[st.Region]
	d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.Offered(now, r.idx, k, n, st.Cost) })
	r.mu.Lock()
	live := append([]*liveInstance(nil), r.insts...)
	vers := r.vers
	r.mu.Unlock()
	if len(live) == 0 {
		d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.Unserved(now, r.idx, k, n*st.Cost) })
		return
	}
	spread := len(live)
	if st.PerInstance > 0 {
		spread = min(max(int(math.Ceil(st.Rate(d.rec.virtual(time.Now()))/st.PerInstance)), 1), len(live))
	}
	if rt.vers != vers || rt.spread != spread || rt.chosen == nil {
		sort.Slice(live, func(i, j int) bool { return score(id, live[i].num) > score(id, live[j].num) })
		rt.vers, rt.spread, rt.chosen = vers, spread, live[:spread]
	}
	per := n / int64(len(rt.chosen))
	extra := n % int64(len(rt.chosen))
	for i, in := range rt.chosen {
		m := per
		if int64(i) < extra {
			m++
		}
		if m == 0 {
			continue
		}
		in.mu.Lock()
		in.used[k] = true
		in.mu.Unlock()
		select {
		case in.reqs <- request{key: k, n: m, cost: st.Cost}:
		default: // the instance is hopelessly behind: its requests time out
			d.pace.refused(m)
			d.rec.do(func(o *oracle.Oracle, now time.Duration) { o.Decided(now, r.idx, k, m*st.Cost, oracle.SourceDenied) })
		}
	}
}

// score is a rendezvous hash of (stream, instance).
func score(stream, inst int) uint64 {
	x := uint64(stream)<<24 ^ uint64(inst) + 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// stopWorkers ends every instance's worker once nothing sends any more.
func (d *deployment) stopWorkers() {
	for _, r := range d.regions {
		for _, in := range r.allInstances() {
			in.closer.Do(func() { close(in.reqs) })
		}
	}
	d.workers.Wait()
}

func (d *deployment) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.stopWorkers()
	for _, r := range d.regions {
		for _, in := range r.allInstances() {
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			in.client.Close(cctx)
			ccancel()
			in.conn.Close()
		}
		r.rdb.Close()
	}
	d.stopReplays()
	d.replayJobs.Wait()
	if d.c != nil {
		d.c.Stop()
	}
}

// addGlobal keeps a started global daemon for its metrics.
func (d *deployment) addGlobal(dm *allocator.Daemon) {
	if dm == nil {
		return
	}
	d.globalMu.Lock()
	defer d.globalMu.Unlock()
	d.globals = append(d.globals, dm)
}

// countRPCs reads the control-plane traffic from the regional daemons'
// metrics: LeaseService RPCs, region leader syncs with the global tier, and
// Lua script calls (a pipelined batch of one Sync counts once here, where
// virtual mode counts every script); and the grants the global daemons
// sent.
func (d *deployment) countRPCs() {
	var tiers [3]int64
	var daemons []*regional.Daemon
	for _, r := range d.regions {
		r.mu.Lock()
		daemons = append(daemons, r.daemons...)
		r.mu.Unlock()
	}
	for _, dm := range daemons {
		fams, err := dm.Registry.Gather()
		if err != nil {
			continue
		}
		for _, f := range fams {
			var n int64
			for _, m := range f.GetMetric() {
				if c := m.GetCounter(); c != nil {
					n += int64(c.GetValue())
				}
				if h := m.GetHistogram(); h != nil {
					n += int64(h.GetSampleCount())
				}
			}
			switch f.GetName() {
			case "sluice_regional_requests_total":
				tiers[oracle.TierInstance] += n
			case "sluice_regional_global_syncs_total":
				tiers[oracle.TierGlobal] += n
			case "sluice_regional_lua_duration_seconds":
				tiers[oracle.TierRedis] += n
			}
		}
	}
	var sent int64
	d.globalMu.Lock()
	globals := append([]*allocator.Daemon(nil), d.globals...)
	d.globalMu.Unlock()
	for _, dm := range globals {
		fams, err := dm.Registry.Gather()
		if err != nil {
			continue
		}
		for _, f := range fams {
			if f.GetName() != "sluice_global_grants_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				sent += int64(m.GetCounter().GetValue())
			}
		}
	}
	d.rec.do(func(o *oracle.Oracle, _ time.Duration) {
		for t, n := range tiers {
			o.RPC(oracle.Tier(t), int(n))
		}
		o.GrantsSent(int(sent))
	})
}
