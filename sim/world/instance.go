package world

import (
	"fmt"
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/sim/oracle"
)

// Instance is one application process embedding the lease client: the real
// lease.Table, lease.Breaker and lease.Core (every decision of the Client's
// request path and owner loop) pumped on simulated links and virtual time,
// as Client pumps them on gRPC and the real clock. Like everything in a
// World it is used only by the goroutine running the World.
type Instance struct {
	w      *World
	region *Region
	num    int
	id     string
	offset time.Duration
	table  *lease.Table
	core   *lease.Core

	alive    bool // running (false once crashed or stopped)
	draining bool // stopping gracefully: taking no requests, finishing those in flight
	stopping bool // stopping gracefully: the lease client closing (Client.Close)
	active   int  // request groups taken and not yet decided
	isolated bool // cut off from its region's service (instance-isolate)
	gen      int

	used    []bool // key ids this instance ever used
	usedIDs []int

	// Owner loop pump state (the Client's loop goroutine, serialised).
	busy        bool
	pendTick    bool
	pendKick    bool
	pendFalls   bool
	pendExpiry  bool
	expiryToken int
	waiters     map[int][]*group
	afterIdle   func() // graceful stop continuation once nothing is in flight
}

// group is requests of one key and cost on one instance that arrived
// together; the first is pumped through lease.Slow, the others follow it
// in order.
type group struct {
	k       *keyInfo
	slow    lease.Slow
	cost    int64
	n       int64
	waitTok int
}

func newInstance(r *Region, num int) *Instance {
	w := r.w
	in := &Instance{
		w: w, region: r, num: num, id: fmt.Sprintf("%s-%d", r.name, num),
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
		// Keys in key order, not a map's random one: with more keys than
		// a Sync batch holds, which keys share a batch (and so when each
		// is answered) must follow from the scenario and the seed.
		OrderedScans: true,
	})
	if err != nil {
		panic("sim: lease table options refused: " + err.Error())
	}
	in.table = t
	in.core = lease.NewCore(t, lease.NewBreaker(w.breakerFailures, w.breakerCooldown), 0).WithBreakerTimeout(w.breakerTimeout)
	return in
}

func (in *Instance) now() time.Time { return in.w.clockAt(in.offset) }

func (in *Instance) start() {
	w := in.w
	phase := time.Duration(w.rngInst.Int64N(int64(w.refresh)))
	gen := in.gen
	// periodic sets pend every period from first on, as the Client's
	// tickers do, while this incarnation lives.
	periodic := func(first, period time.Duration, pend *bool) {
		var tick func()
		tick = func() {
			if !in.alive || in.gen != gen || in.stopping {
				return
			}
			*pend = true
			in.wake()
			w.eng.After(period, tick)
		}
		w.eng.After(first, tick)
	}
	periodic(phase, w.refresh, &in.pendTick)
	falls := lease.FallCheckEvery(w.refresh)
	periodic(phase+falls, falls, &in.pendFalls)
	in.armExpiry(w.refresh)
}

// --- Request path (the pump of Client.allowSlow). ---

// handle decides n requests of key at the current instant.
func (in *Instance) handle(k *keyInfo, n, cost int64) {
	if !in.used[k.id] {
		in.used[k.id] = true
		in.usedIDs = append(in.usedIDs, k.id)
	}
	in.active++
	in.serve(&group{k: k, slow: in.core.Slow(k.key, cost), cost: cost, n: n})
}

type tally struct{ lease, strict, degraded, shadow, denied, unanswered int64 }

func (in *Instance) record(t *tally, st lease.Step, cost int64, strict bool) {
	d := st.Decision
	switch {
	case st.Err != nil:
		in.w.counters.InvalidDecisions++
		t.denied += cost
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
	if t.unanswered > 0 {
		o.Decided(now, r, k.id, t.unanswered, oracle.SourceUnanswered)
	}
}

func (in *Instance) serve(g *group) { in.run(g, g.slow.Next(in.now())) }

// run carries out the group's steps from st, deciding its requests one
// after another, until one must wait for simulated I/O.
func (in *Instance) run(g *group, st lease.Step) {
	var t tally
	decided := false
	defer func() {
		if decided {
			in.groupDone()
		}
	}()
	defer in.flush(g.k, &t)
	for g.n > 0 {
		if st.ApplyErr != nil {
			in.w.counters.ApplyErrors++
		}
		if st.Ended != nil {
			in.batchDone(st.Ended)
		}
		switch st.Do {
		case lease.DoCheck:
			in.check(g)
			return
		case lease.DoWait:
			in.park(g)
			return
		case lease.DoAcquire:
			in.acquire(g, st.Batch)
			return
		}
		in.record(&t, st, g.cost, false)
		g.n--
		if st.Kick {
			in.kick()
		}
		if g.n > 0 {
			st = g.slow.Next(in.now())
		}
	}
	decided = true
}

// groupDone is called once every request of a group is decided: a
// graceful stop closes the lease client once none is left.
func (in *Instance) groupDone() {
	in.active--
	if in.draining && in.active == 0 {
		in.draining = false
		in.closeClient()
	}
}

// park waits for the report in flight on the group's key, for at most the
// request timeout (Client.waitFor: Core.RequestTimeout); then every request of the group that
// waited is decided by Slow.WaitFailed.
func (in *Instance) park(g *group) {
	in.waiters[g.k.id] = append(in.waiters[g.k.id], g)
	g.waitTok++
	tok, gen := g.waitTok, in.gen
	in.w.eng.After(in.core.RequestTimeout(in.w.breakerTimeout), func() {
		if !in.alive || in.gen != gen || g.waitTok != tok {
			return
		}
		if !in.unpark(g) {
			return
		}
		var t tally
		now := in.now()
		for ; g.n > 0; g.n-- {
			in.record(&t, g.slow.WaitFailed(now), g.cost, false)
		}
		in.flush(g.k, &t)
		in.groupDone()
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

// batchDone is called once a batch has ended in the table (applied or
// failed): waiters on its keys try again, and a graceful stop proceeds
// once nothing is in flight.
func (in *Instance) batchDone(b *lease.Batch) {
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
	if in.afterIdle != nil && len(in.table.InFlight()) == 0 {
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
		func() (time.Duration, bool) { return w.net.localDelay(), in.isolated },
		func() (time.Duration, bool) {
			d, lost := w.net.localReply(in.region.idx)
			if lost {
				w.counters.LostAnswers++
			}
			return d, lost || in.isolated
		},
		timeout,
		func() bool { return in.gen == gen && (in.alive || in.stopping) },
		serve, onReply, onFail,
	)
}

// acquire sends the synchronous Acquire (or one-report Sync) the group's
// first request stepped to, and goes on with the step that follows. As the
// client does (lease.Client's acquire), the group waits for the call at
// most the request timeout, and the call goes on up to its own
// (lease.Core.AcquireCallTimeout): when the group gave up on it first
// (lease.Slow.AcquireGaveUp), its end is the end of a background Sync
// (lease.Core.SyncDone), a late answer landing its grant.
func (in *Instance) acquire(g *group, b *lease.Batch) {
	var grants []*sluicev1.Grant
	useSync := b.UseSync()
	waiting, gen := true, in.gen
	in.w.eng.After(in.core.RequestTimeout(in.w.breakerTimeout), func() {
		if !waiting || in.gen != gen || !(in.alive || in.stopping) {
			return
		}
		waiting = false
		st, _ := g.slow.AcquireGaveUp(in.now(), false)
		in.run(g, st)
	})
	ended := func(out lease.Outcome) {
		if !waiting {
			in.core.SyncDone(in.now(), b, grants, out)
			in.w.recycle(grants)
			in.batchDone(b)
			return
		}
		waiting = false
		st := g.slow.AcquireDone(in.now(), grants, out)
		in.w.recycle(grants)
		in.batchDone(b)
		in.run(g, st)
	}
	in.rpc(in.core.AcquireCallTimeout(in.w.breakerTimeout),
		func() bool {
			var ok bool
			grants, ok = in.region.leaseOp(in.id, b.Reports, !useSync)
			in.replayLease(b.Reports, func(reps []*sluicev1.KeyReport) {
				g, _ := in.region.leaseOp(in.id, reps, !useSync)
				in.w.recycle(g)
			})
			return ok
		},
		func() { ended(lease.Answered) },
		func() {
			grants = nil
			ended(lease.Unreachable)
		})
}

// check sends the strict Checks of the group's requests (n concurrent
// Checks; the first stepped to it and claimed the breaker).
func (in *Instance) check(g *group) {
	n := g.n
	g.n = 0
	var resps []*sluicev1.CheckResponse
	for i := int64(1); i < n; i++ {
		in.w.orc.RPC(oracle.TierInstance, 1) // the others of the n concurrent Checks
	}
	in.rpc(in.core.RequestTimeout(in.w.breakerTimeout),
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
			// The region counted these decisions when it made them: they
			// stay undelivered until the instance records them, and those
			// whose caller gets an error instead stay so.
			var t tally
			now := in.now()
			for _, r := range resps {
				st := g.slow.CheckDone(now, r, lease.Answered)
				if st.Err != nil {
					in.w.counters.InvalidDecisions++
					t.unanswered += g.cost
					continue
				}
				in.w.orc.RegionPending(in.region.idx, g.k.id, -g.cost)
				in.record(&t, st, g.cost, true)
			}
			in.flush(g.k, &t)
			in.groupDone()
		},
		func() {
			var t tally
			now := in.now()
			in.record(&t, g.slow.CheckDone(now, nil, lease.Unreachable), g.cost, false)
			for i := int64(1); i < n; i++ {
				in.record(&t, g.slow.Fallback(now), g.cost, false)
			}
			in.flush(g.k, &t)
			in.groupDone()
		})
}

// --- Owner loop (the pump of Client.loop). ---

func (in *Instance) kick() {
	in.pendKick = true
	if !in.wakeAfterRefillWait() {
		in.wake()
	}
}

// wakeAfterRefillWait schedules a wake-up for when a kick pending now may
// be served (Core.RefillWait; the Client's hold timer) and reports true,
// if it must wait.
func (in *Instance) wakeAfterRefillWait() bool {
	w := in.core.RefillWait(in.now())
	if w <= 0 {
		return false
	}
	gen := in.gen
	in.w.eng.After(w, func() {
		if in.gen == gen {
			in.wake()
		}
	})
	return true
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
	case in.pendKick && in.core.RefillWait(in.now()) <= 0:
		in.pendKick = false
		in.busy = true
		in.refill()
	case in.pendFalls:
		in.pendFalls = false
		in.busy = true
		in.sendEarly(in.core.PrepareFalls(in.now()))
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
	in.armExpiry(in.core.Expire(in.now()))
	if in.core.GiveBackDue() {
		in.kick()
	}
	if in.pendKick {
		// A kick that came while this step ran, which may have been an
		// early refill: it waits what is left of the spacing.
		in.wakeAfterRefillWait()
	}
	in.wake()
}

func (in *Instance) syncAll() {
	round := in.core.PrepareSync(in.now())
	var next func()
	next = func() {
		b, release := round.Next()
		switch {
		case b == nil:
			in.loopDone()
		case release:
			in.sendRelease(b, next)
		default:
			in.sendSync(b, func(out lease.Outcome, grants []*sluicev1.Grant) {
				_, skipped, err := round.Sent(in.now(), b, grants, out)
				if err != nil {
					in.w.counters.ApplyErrors++
				}
				in.batchDone(b)
				for _, rest := range skipped {
					in.batchDone(rest)
				}
				next()
			})
		}
	}
	next()
}

func (in *Instance) refill() {
	in.sendEarly(in.core.PrepareRefill(in.now()))
}

// sendEarly sends an early Sync batch outside the periodic round, if
// there is one, and ends the loop's step (Client.sendEarly).
func (in *Instance) sendEarly(b *lease.Batch) {
	if b == nil {
		in.loopDone()
		return
	}
	in.syncOnce(b, in.loopDone)
}

// syncOnce sends one Sync batch outside a round and ends it.
func (in *Instance) syncOnce(b *lease.Batch, then func()) {
	in.sendSync(b, func(out lease.Outcome, grants []*sluicev1.Grant) {
		if _, err := in.core.SyncDone(in.now(), b, grants, out); err != nil {
			in.w.counters.ApplyErrors++
		}
		in.batchDone(b)
		then()
	})
}

// sendSync sends a Sync batch (the simulated region never refuses one);
// done gets how it ended and the grants, valid until done returns.
func (in *Instance) sendSync(b *lease.Batch, done func(lease.Outcome, []*sluicev1.Grant)) {
	in.core.BeforeSend(in.now())
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
			done(lease.Answered, grants)
			in.w.recycle(grants)
		},
		func() { done(lease.Unreachable, nil) })
}

func (in *Instance) sendRelease(b *lease.Batch, done func()) {
	sent := in.now()
	in.core.BeforeSend(sent)
	in.rpc(lease.DefaultSyncTimeout(in.w.refresh),
		func() bool {
			in.replayLease(b.Reports, func(reps []*sluicev1.KeyReport) { in.region.release(in.id, reps) })
			return in.region.release(in.id, b.Reports)
		},
		func() { in.core.ReleaseDone(sent, in.now(), lease.Answered); done() },
		func() { in.core.ReleaseDone(sent, in.now(), lease.Unreachable); done() })
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
	in.draining = false
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

// stop is a graceful stop as the agent makes it (agent.Stop): the server
// takes no new request (the load balancer stops sending them), the
// requests in flight are decided (their Checks, Acquires and waits end as
// they would), then the lease client closes (closeClient).
func (in *Instance) stop() {
	if !in.alive || in.draining || in.stopping {
		return
	}
	in.draining = true
	in.region.removeInstance(in)
	if in.active == 0 {
		in.draining = false
		in.closeClient()
	}
}

// closeClient is Client.Close: pools are drained, reports in flight
// finish, unacknowledged reports are resent, then one Release returns
// every unspent token.
func (in *Instance) closeClient() {
	in.stopping = true
	in.table.Drain()
	finish := func() {
		in.alive = false
		in.stopping = false
		in.gen++
	}
	release := func() {
		if b := in.table.PrepareRelease(in.now()); b != nil {
			in.sendRelease(b, finish)
			return
		}
		finish()
	}
	proceed := func() {
		if b := in.table.PreparePending(in.now()); b != nil {
			in.syncOnce(b, release)
			return
		}
		release()
	}
	if len(in.table.InFlight()) == 0 {
		proceed()
		return
	}
	in.afterIdle = proceed
}
