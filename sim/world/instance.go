package world

import (
	"fmt"
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/sim/engine"
	"github.com/sluicehq/sluice/sim/oracle"
)

// Instance is one application process embedding the lease client: the real
// lease.Table and lease.Breaker driven by a mirror of the Client's request
// path (allowSlow) and owner loop. Like everything in a World it is used
// only by the goroutine running the World.
type Instance struct {
	w      *World
	region *Region
	num    int
	id     string
	offset time.Duration
	table  *lease.Table
	brk    *lease.Breaker

	alive    bool // running (false once crashed or stopped)
	stopping bool // draining for a graceful stop
	gen      int

	used    []bool // key ids this instance ever used
	usedIDs []int

	// Owner loop state (the Client's loop goroutine, serialised).
	busy        bool
	pendTick    bool
	pendKick    bool
	pendExpiry  bool
	holdUntil   engine.Time
	expiryToken int
	inflight    int // batches marked in flight in the table
	waiters     map[int][]*group
	afterIdle   func() // graceful stop continuation once nothing is in flight
}

// group is requests of one key and cost on one instance that arrived
// together and are decided together, in order.
type group struct {
	k        *keyInfo
	qk       quota.Key
	cost     int64
	n        int64
	acquires int
	rounds   int
	waitTok  int
}

func newInstance(r *Region, num int) *Instance {
	w := r.w
	in := &Instance{
		w: w, region: r, num: num, id: fmt.Sprintf("%s-%d", r.name, num),
		brk:     lease.NewBreaker(w.breakerFailures, w.breakerCooldown),
		alive:   true,
		used:    make([]bool, len(w.keys)),
		waiters: map[int][]*group{},
	}
	if skew := time.Duration(w.sc.Topology.InstanceClockSkew); skew > 0 {
		in.offset = time.Duration(w.rngInst.Int64N(int64(2*skew))) - skew
	}
	in.offset += r.offset
	t, err := lease.NewTable(lease.TableOptions{
		Refresh: w.refresh, Classes: w.classes,
		// The Client starts seqs at its start time in µs, so a reused id
		// never reports below its previous life.
		SeqBase: uint64(w.clockAt(in.offset).UnixMicro()),
	})
	if err != nil {
		panic("sim: lease table options refused: " + err.Error())
	}
	in.table = t
	return in
}

func (in *Instance) now() time.Time { return in.w.clockAt(in.offset) }

func (in *Instance) start() {
	w := in.w
	phase := time.Duration(w.rngInst.Int64N(int64(w.refresh)))
	gen := in.gen
	var tick func()
	tick = func() {
		if !in.alive || in.gen != gen || in.stopping {
			return
		}
		in.pendTick = true
		in.wake()
		w.eng.After(w.refresh, tick)
	}
	w.eng.After(phase, tick)
	in.armExpiry(w.refresh)
}

// --- Request path (Client.allowSlow). ---

// handle decides n requests of key at the current instant.
func (in *Instance) handle(k *keyInfo, n, cost int64) {
	if !in.used[k.id] {
		in.used[k.id] = true
		in.usedIDs = append(in.usedIDs, k.id)
	}
	in.serve(&group{k: k, qk: k.key, cost: cost, n: n})
}

type tally struct{ lease, strict, degraded, shadow, denied int64 }

func (in *Instance) record(t *tally, d quota.Decision, cost int64, strict bool) {
	switch {
	case d.Allowed && d.WouldDeny:
		t.shadow += cost
	case !d.Allowed:
		t.denied += cost
	case d.Degraded:
		t.degraded += cost
	case strict:
		t.strict += cost
	default:
		t.lease += cost
	}
}

func (in *Instance) flush(k *keyInfo, t *tally) {
	o, now, r := in.w.orc, in.w.dur(), in.region.idx
	if t.lease > 0 {
		o.Decided(now, r, k.id, t.lease, oracle.SourceLease)
	}
	if t.strict > 0 {
		o.Decided(now, r, k.id, t.strict, oracle.SourceStrict)
	}
	if t.degraded > 0 {
		o.Decided(now, r, k.id, t.degraded, oracle.SourceDegraded)
	}
	if t.shadow > 0 {
		o.Decided(now, r, k.id, t.shadow, oracle.SourceShadow)
	}
	if t.denied > 0 {
		o.Decided(now, r, k.id, t.denied, oracle.SourceDenied)
	}
}

func (in *Instance) serve(g *group) {
	var t tally
	defer in.flush(g.k, &t)
	now := in.now()
	for g.n > 0 {
		d, act, err := in.table.Allow(now, g.qk, g.cost)
		if err != nil {
			in.w.counters.InvalidDecisions += g.n
			t.denied += g.n * g.cost
			g.n = 0
			return
		}
		switch act {
		case lease.ActNone, lease.ActRefill:
			in.record(&t, d, g.cost, false)
			g.n--
			g.acquires, g.rounds = 0, 0
			if act == lease.ActRefill {
				in.kick()
			}
			continue
		case lease.ActCheck:
			in.check(g)
			return
		}
		if lease.GiveUp(g.acquires, g.rounds) {
			d, _ := in.table.Exhausted(now, g.qk, g.cost)
			in.record(&t, d, g.cost, false)
			g.n--
			g.acquires, g.rounds = 0, 0
			continue
		}
		g.rounds++
		if !in.brk.Ready(now) {
			in.fallbackAll(&t, g, now)
			return
		}
		b, wait := in.table.PrepareAcquire(now, g.qk, g.cost)
		switch {
		case wait != nil:
			in.park(g)
			return
		case b != nil:
			g.acquires++
			in.acquire(g, b)
			return
		}
	}
}

func (in *Instance) fallbackAll(t *tally, g *group, now time.Time) {
	for ; g.n > 0; g.n-- {
		d, err := in.table.Fallback(now, g.qk, g.cost)
		if err != nil {
			in.w.counters.InvalidDecisions++
			t.denied += g.cost
			continue
		}
		in.record(t, d, g.cost, false)
	}
}

// park waits for the report in flight on the group's key, for at most the
// breaker timeout (Client.waitFor).
func (in *Instance) park(g *group) {
	in.waiters[g.k.id] = append(in.waiters[g.k.id], g)
	g.waitTok++
	tok, gen := g.waitTok, in.gen
	in.w.eng.After(in.w.breakerTimeout, func() {
		if !in.alive || in.gen != gen || g.waitTok != tok {
			return
		}
		if !in.unpark(g) {
			return
		}
		var t tally
		in.fallbackAll(&t, g, in.now())
		in.flush(g.k, &t)
	})
}

func (in *Instance) unpark(g *group) bool {
	ws := in.waiters[g.k.id]
	for i, x := range ws {
		if x == g {
			in.waiters[g.k.id] = append(ws[:i], ws[i+1:]...)
			if len(in.waiters[g.k.id]) == 0 {
				delete(in.waiters, g.k.id)
			}
			return true
		}
	}
	return false
}

// batchDone ends a batch that was marked in flight: waiters on its keys
// try again, and a graceful stop proceeds once nothing is in flight.
func (in *Instance) batchDone(b *lease.Batch) {
	in.inflight--
	if len(in.waiters) > 0 {
		// A batch lists its keys in the table's map order: wake waiters in
		// key order so the run does not depend on it.
		var ids []int
		for _, qk := range b.Keys() {
			if k := in.w.keyByQK[qk]; k != nil && len(in.waiters[k.id]) > 0 {
				ids = append(ids, k.id)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			ws := in.waiters[id]
			delete(in.waiters, id)
			for _, g := range ws {
				g.waitTok++
				in.serve(g)
			}
		}
	}
	if in.inflight == 0 && in.afterIdle != nil {
		f := in.afterIdle
		in.afterIdle = nil
		f()
	}
}

// rpc runs one LeaseService call from this instance to its region.
func (in *Instance) rpc(timeout time.Duration, serve func() bool, onReply, onFail func()) {
	w := in.w
	gen := in.gen
	w.orc.RPC(oracle.TierInstance, 1)
	w.exchange(
		func() (time.Duration, bool) { return w.net.localDelay(), false },
		func() (time.Duration, bool) { return w.net.localReply(in.region.idx) },
		timeout,
		func() bool { return in.gen == gen && (in.alive || in.stopping) },
		serve, onReply, onFail,
	)
}

// acquire is Client.acquire: a synchronous Acquire (or a one-report Sync).
func (in *Instance) acquire(g *group, b *lease.Batch) {
	now := b.SentAt()
	in.inflight++
	if !in.brk.Allow(now) {
		in.table.Failed(now, b)
		in.batchDone(b)
		in.fallbackOne(g)
		return
	}
	var grants []*sluicev1.Grant
	useSync := b.UseSync()
	in.rpc(in.w.breakerTimeout,
		func() bool {
			var ok bool
			grants, ok = in.region.leaseOp(in.id, b.Reports, !useSync)
			in.replayLease(b.Reports, func(reps []*sluicev1.KeyReport) {
				g, _ := in.region.leaseOp(in.id, reps, !useSync)
				in.w.recycle(g)
			})
			return ok
		},
		func() {
			in.brk.Success()
			if err := in.table.Apply(in.now(), b, grants); err != nil {
				in.w.counters.ApplyErrors++
			}
			in.w.recycle(grants)
			in.batchDone(b)
			in.serve(g)
		},
		func() {
			now := in.now()
			in.table.Failed(now, b)
			in.brk.Failure(now)
			in.batchDone(b)
			in.fallbackOne(g)
		})
}

// fallbackOne decides the group's first request with the on_failure policy
// (the request whose RPC failed) and goes on with the rest.
func (in *Instance) fallbackOne(g *group) {
	if g.n == 0 {
		return
	}
	var t tally
	now := in.now()
	if d, err := in.table.Fallback(now, g.qk, g.cost); err == nil {
		in.record(&t, d, g.cost, false)
	} else {
		in.w.counters.InvalidDecisions++
		t.denied += g.cost
	}
	g.n--
	g.acquires, g.rounds = 0, 0
	in.flush(g.k, &t)
	in.serve(g)
}

// check is the strict path: one Check RPC per request.
func (in *Instance) check(g *group) {
	now := in.now()
	n := g.n
	g.n = 0
	if !in.brk.Allow(now) {
		var t tally
		g.n = n
		in.fallbackAll(&t, g, now)
		in.flush(g.k, &t)
		return
	}
	var resps []*sluicev1.CheckResponse
	for i := int64(1); i < n; i++ {
		in.w.orc.RPC(oracle.TierInstance, 1) // the others of the n concurrent Checks
	}
	in.rpc(in.w.breakerTimeout,
		func() bool {
			resps = resps[:0]
			for i := int64(0); i < n; i++ {
				r, ok := in.region.check(g.k, g.cost)
				if !ok {
					return false
				}
				resps = append(resps, r)
			}
			return true
		},
		func() {
			in.brk.Success()
			// The region counted these decisions when it made them.
			in.w.orc.RegionPending(in.region.idx, g.k.id, -int64(len(resps))*g.cost)
			var t tally
			now := in.now()
			for _, r := range resps {
				d, err := in.table.ApplyCheck(now, g.qk, g.cost, r)
				if err != nil {
					in.w.counters.InvalidDecisions++
					t.denied += g.cost
					continue
				}
				in.record(&t, d, g.cost, true)
			}
			in.flush(g.k, &t)
		},
		func() {
			now := in.now()
			in.brk.Failure(now)
			var t tally
			g.n = n
			in.fallbackAll(&t, g, now)
			in.flush(g.k, &t)
		})
}

// --- Owner loop (Client.loop). ---

func (in *Instance) kick() {
	in.pendKick = true
	if now := in.w.eng.Now(); now < in.holdUntil {
		gen := in.gen
		in.w.eng.At(in.holdUntil, func() {
			if in.gen == gen {
				in.wake()
			}
		})
		return
	}
	in.wake()
}

func (in *Instance) armExpiry(wait time.Duration) {
	in.expiryToken++
	tok, gen := in.expiryToken, in.gen
	in.w.eng.After(wait, func() {
		if in.gen != gen || in.expiryToken != tok || !in.alive {
			return
		}
		in.pendExpiry = true
		in.wake()
	})
}

// wake runs the next loop iteration if the loop is idle.
func (in *Instance) wake() {
	if in.busy || !in.alive || in.stopping {
		return
	}
	switch {
	case in.pendTick:
		in.pendTick = false
		in.busy = true
		in.syncAll()
	case in.pendKick && in.w.eng.Now() >= in.holdUntil:
		in.pendKick = false
		in.busy = true
		in.refill()
	case in.pendExpiry:
		in.pendExpiry = false
		in.busy = true
		in.loopDone()
	}
}

// loopDone ends one loop iteration: enforce lease deadlines, re-arm the
// expiry timer, take the next pending wake-up.
func (in *Instance) loopDone() {
	in.busy = false
	if !in.alive || in.stopping {
		return
	}
	now := in.now()
	wait := in.w.refresh
	if next := in.table.Expire(now); !next.IsZero() {
		wait = next.Sub(now)
	}
	in.armExpiry(wait)
	in.wake()
}

func (in *Instance) syncAll() {
	now := in.now()
	syncs, release := in.table.PrepareSync(now)
	in.inflight += len(syncs)
	var next func(i int)
	next = func(i int) {
		if i == len(syncs) {
			if release != nil {
				in.sendRelease(release, func(bool) { in.loopDone() })
				return
			}
			in.loopDone()
			return
		}
		in.sendSync(syncs[i], func(failed bool) {
			if failed {
				for _, rest := range syncs[i+1:] {
					in.table.Failed(now, rest)
					in.batchDone(rest)
				}
				next(len(syncs))
				return
			}
			next(i + 1)
		})
	}
	next(0)
}

func (in *Instance) refill() {
	now := in.now()
	in.holdUntil = in.w.eng.Now().Add(lease.RefillSpacing(in.w.refresh))
	b := in.table.PrepareRefill(now)
	if b == nil {
		in.loopDone()
		return
	}
	in.inflight++
	in.sendSync(b, func(bool) { in.loopDone() })
}

// sendSync sends a Sync batch already counted in flight.
func (in *Instance) sendSync(b *lease.Batch, done func(failed bool)) {
	var grants []*sluicev1.Grant
	in.rpc(lease.DefaultSyncTimeout(in.w.refresh),
		func() bool {
			var ok bool
			grants, ok = in.region.leaseOp(in.id, b.Reports, false)
			in.replayLease(b.Reports, func(reps []*sluicev1.KeyReport) {
				g, _ := in.region.leaseOp(in.id, reps, false)
				in.w.recycle(g)
			})
			return ok
		},
		func() {
			in.brk.Success()
			if err := in.table.Apply(in.now(), b, grants); err != nil {
				in.w.counters.ApplyErrors++
			}
			in.w.recycle(grants)
			in.batchDone(b)
			done(false)
		},
		func() {
			now := in.now()
			in.brk.Failure(now)
			in.table.Failed(now, b)
			in.batchDone(b)
			done(true)
		})
}

func (in *Instance) sendRelease(b *lease.Batch, done func(failed bool)) {
	in.rpc(lease.DefaultSyncTimeout(in.w.refresh),
		func() bool {
			in.replayLease(b.Reports, func(reps []*sluicev1.KeyReport) { in.region.release(in.id, reps) })
			return in.region.release(in.id, b.Reports)
		},
		func() { in.brk.Success(); done(false) },
		func() { in.brk.Failure(in.now()); done(true) })
}

// --- Failures. ---

// crash kills the instance: nothing is released. Its leases are followed
// until the region's Model reaps them (observe.go), and the oracle is told
// the crash error ε then: per key, tokens the reaped lease still counted
// as unspent but that the instance had spent.
func (in *Instance) crash() *crashRecord {
	if !in.alive {
		return nil
	}
	w := in.w
	r := in.region
	in.alive = false
	in.gen++
	r.removeInstance(in)
	rec := &crashRecord{w: w, at: w.dur()}
	if !r.redisUp {
		return rec
	}
	for _, id := range in.usedIDs {
		k := w.keys[id]
		l, ok := r.model.PeekLease(k.rkeys, in.id)
		if !ok {
			continue
		}
		st, _ := in.table.State(k.key)
		cl := &crashLease{crash: rec, instance: in.id, held: float64(st.Tokens + st.ToReturn),
			reclaim: k.common[r.idx].Reclaim, last: l}
		if p := st.Pending; p != nil {
			cl.pendSeq, cl.pendRet = p.GetSeq(), float64(p.GetReturned())
		}
		rec.pending++
		r.crashed[k.id] = append(r.crashed[k.id], cl)
	}
	if rec.pending == 0 {
		w.orc.Reclaimed(rec.at, rec.at, 0)
	}
	return rec
}

// stop is Client.Close: the load balancer stops sending requests, pools
// are drained, reports in flight finish, unacknowledged reports are
// resent, then one Release returns every unspent token.
func (in *Instance) stop() {
	if !in.alive || in.stopping {
		return
	}
	in.stopping = true
	in.region.removeInstance(in)
	in.table.Drain()
	finish := func() {
		in.alive = false
		in.stopping = false
		in.gen++
	}
	release := func() {
		if b := in.table.PrepareRelease(in.now()); b != nil {
			in.sendRelease(b, func(bool) { finish() })
			return
		}
		finish()
	}
	proceed := func() {
		if b := in.table.PreparePending(in.now()); b != nil {
			in.inflight++
			in.sendSync(b, func(bool) { release() })
			return
		}
		release()
	}
	if in.inflight == 0 {
		proceed()
		return
	}
	in.afterIdle = proceed
}
