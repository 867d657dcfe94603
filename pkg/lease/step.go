package lease

import (
	"errors"
	"fmt"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Core is every decision of the instance client that is not in the Table:
// the request path's rounds (acquire, wait, check, give up, fall back) and
// the owner loop's (the periodic Sync round, refills, what an RPC's outcome
// does to the table and the breaker, when to enforce deadlines next). It
// never reads the clock and never does I/O: each step takes now and says
// what to send or to wait for, and the caller reports how the send ended.
// Client is a pump around it on gRPC and real time; the simulator
// (sim/world) is a pump around it on simulated links and virtual time.
// Safe for concurrent use as far as the Table and Breaker are: request
// steps on any goroutines, owner steps on one.
type Core struct {
	table       *Table
	brk         *Breaker
	syncTimeout time.Duration
	// breakerTimeout is the base of a request's synchronous wait
	// (RequestTimeout); 0 until WithBreakerTimeout: no bound across rounds.
	breakerTimeout time.Duration
	// lastRefill is when PrepareRefill last returned a batch (zero: never);
	// owner loop only. RefillWait counts the spacing from it.
	lastRefill time.Time
}

// WithBreakerTimeout sets the breaker timeout a request's synchronous wait
// is based on (RequestTimeout): a request stops asking the region once its
// rounds together took that long, so one decision waits one timeout, not
// one per round (a request that waited for another's refill, which then
// failed, used to start its own acquire and wait a second timeout).
// Returns c. Call before use.
func (c *Core) WithBreakerTimeout(d time.Duration) *Core {
	c.breakerTimeout = d
	return c
}

// Budget is what remains at now of the synchronous wait of the request s
// is on: RequestTimeout(base) from its first round (base when the core
// has none set).
func (s *Slow) Budget(now time.Time, base time.Duration) time.Duration {
	if s.c.breakerTimeout > 0 {
		base = s.c.breakerTimeout
	}
	t := s.c.RequestTimeout(base)
	if s.began.IsZero() {
		return t
	}
	return t - now.Sub(s.began)
}

// NewCore returns the decisions over table and brk. syncTimeout bounds one
// background Sync or Release (0: DefaultSyncTimeout of the table's
// Refresh); the owner enforces deadlines against it before each send.
func NewCore(table *Table, brk *Breaker, syncTimeout time.Duration) *Core {
	if syncTimeout <= 0 {
		syncTimeout = DefaultSyncTimeout(table.opts.Refresh)
	}
	// A key whose Redis node failed is held off for the breaker's
	// cooldown, as the whole region would be (KeyFailed).
	table.keyHoldOff = brk.cooldown
	return &Core{table: table, brk: brk, syncTimeout: syncTimeout}
}

// Table is the core's table.
func (c *Core) Table() *Table { return c.table }

// Breaker is the core's circuit breaker.
func (c *Core) Breaker() *Breaker { return c.brk }

// RequestTimeout is how long a request's synchronous wait for the region
// (an acquire, a check, a refill in flight) lasts before its on_failure
// policy decides: the breaker timeout base, or longer while the region's
// recent answers were slow (Breaker.Timeout), never longer than a
// background Sync's timeout or base, whichever is longer.
func (c *Core) RequestTimeout(base time.Duration) time.Duration {
	return c.brk.Timeout(base, c.syncTimeout)
}

// Outcome is how one RPC to the region ended, as the decisions see it.
type Outcome uint8

const (
	// Answered: the region answered (grants, or a check response).
	Answered Outcome = iota
	// Refused: the region refused the request as invalid input.
	Refused
	// Conflict: the region refused a report that conflicts with another
	// process's under the same instance id (the region answered).
	Conflict
	// Unreachable: no answer (timeout, transport error, region down).
	Unreachable
	// Abandoned: the caller gave up before an answer (its own context
	// ended); no verdict on the region for the breaker.
	Abandoned
	// KeyFailed: the region answered that the Redis Cluster node holding
	// the call's key failed it (rpcerr.RedisNodeFailed). The region is
	// reachable and serves the keys of its other nodes: the breaker closes,
	// and only the call's keys are decided by their on_failure policies,
	// without calls, until the breaker's cooldown has passed
	// (Table.HoldOff).
	KeyFailed
)

// --- Request path. ---

// Do is what a request on the slow path does next.
type Do uint8

const (
	// DoDecided: Step.Decision (or Step.Err) is final.
	DoDecided Do = iota
	// DoCheck: the key is strict; send one Check for the request (the
	// breaker let it through), then call Slow.CheckDone.
	DoCheck
	// DoWait: a report for the key is in flight; wait for Step.Wait to
	// close for at most the breaker timeout, then call Slow.Next, or
	// Slow.WaitFailed when the wait ended otherwise.
	DoWait
	// DoAcquire: send Step.Batch (a Sync with its one report when
	// Batch.UseSync, else an Acquire) within the breaker timeout, then
	// call Slow.AcquireDone.
	DoAcquire
)

// Step is one step of a request on the slow path.
type Step struct {
	Do       Do
	Decision quota.Decision
	// Err (DoDecided): bad input, ErrClosed, or the region refused the
	// request as invalid (Refused).
	Err error
	// Kick (DoDecided): the key's pool crossed its low-water mark; wake
	// the owner loop to refill.
	Kick bool
	// Degraded (DoDecided): the key's on_failure policy decided, since the
	// region could not be asked or did not answer.
	Degraded bool
	// Refused (DoDecided): the region refused the request as invalid.
	Refused bool
	Batch   *Batch          // DoAcquire
	Wait    <-chan struct{} // DoWait
	// Ended is a batch prepared and ended unsent (the breaker refused
	// it): its key is no longer in flight.
	Ended *Batch
	// ApplyErr is set when the region's grants did not match the reports
	// (those keys' reports stay pending and are resent).
	ApplyErr error
}

// Slow is one request of cost tokens on key past the hot path.
type Slow struct {
	c        *Core
	key      quota.Key
	cost     int64
	acquires int
	rounds   int
	batch    *Batch
	checkAt  time.Time // when the Check in flight was stepped to
	began    time.Time // when the request first waited for the region
	// waitAt is when the request last began waiting on its key's report in
	// flight (sent at or before it); see WaitFailed.
	waitAt time.Time
}

// Slow starts the slow path of a request. The Slow may be reused for
// further requests of the same key and cost once one is decided.
func (c *Core) Slow(key quota.Key, cost int64) Slow {
	return Slow{c: c, key: key, cost: cost}
}

func (s *Slow) decided(d quota.Decision, err error) Step {
	s.acquires, s.rounds, s.batch, s.began, s.waitAt = 0, 0, nil, time.Time{}, time.Time{}
	return Step{Do: DoDecided, Decision: d, Err: err}
}

// Next is the request's next step at now.
func (s *Slow) Next(now time.Time) Step {
	t, brk := s.c.table, s.c.brk
	for {
		d, act, err := t.Allow(now, s.key, s.cost)
		if err != nil {
			return s.decided(d, err)
		}
		switch act {
		case ActNone:
			return s.decided(d, nil)
		case ActRefill:
			st := s.decided(d, nil)
			st.Kick = true
			return st
		case ActCheck:
			if !brk.Allow(now) || t.HeldOff(now, s.key) {
				return s.Fallback(now)
			}
			s.checkAt = now
			return Step{Do: DoCheck}
		}
		if GiveUp(s.acquires, s.rounds) {
			return s.decided(t.Exhausted(now, s.key, s.cost))
		}
		s.rounds++
		if !brk.Ready(now) || t.HeldOff(now, s.key) {
			return s.Fallback(now)
		}
		if s.c.breakerTimeout > 0 && !s.began.IsZero() && s.Budget(now, 0) <= 0 {
			// Its earlier rounds used up the request's wait. When the
			// region answered meanwhile (the tokens it gave went to the
			// key's other requests, or this request's calls went to a
			// hung replica of several) it can decide: denied, to be asked
			// again, as a call answered elsewhere is. Decided by the
			// policy, an open class admitted a hot key's losers of the
			// race for its refills while the region answered.
			if brk.AnsweredAfter(s.began) {
				return s.answeredElsewhere(now)
			}
			return s.Fallback(now)
		}
		b, wait := t.PrepareAcquire(now, s.key, s.cost)
		switch {
		case wait != nil:
			if s.began.IsZero() {
				s.began = now
			}
			s.waitAt = now
			return Step{Do: DoWait, Wait: wait}
		case b != nil:
			if s.began.IsZero() {
				s.began = now
			}
			s.acquires++
			if !brk.Allow(b.SentAt()) {
				t.Failed(b.SentAt(), b)
				st := s.Fallback(now)
				st.Ended = b
				return st
			}
			s.batch = b
			return Step{Do: DoAcquire, Batch: b}
		}
		// Neither: the key changed meanwhile; look again.
	}
}

// Fallback decides the request at now with the key's on_failure policy.
func (s *Slow) Fallback(now time.Time) Step {
	st := s.decided(s.c.table.Fallback(now, s.key, s.cost))
	st.Degraded = true
	return st
}

// answeredElsewhere decides a request whose call got no answer in time
// while the region answered calls sent after it (one replica of several
// hung, or the call queued behind a burst): the region can decide, so the
// on_failure policy does not; the request is denied, to be retried after
// about a round trip. Decided by the policy, a key whose lease the other
// replicas kept serving admitted local tokens on top of its leased ones
// (27 a second over a 20/s key with one replica of two paused).
func (s *Slow) answeredElsewhere(now time.Time) Step {
	return s.decided(s.c.table.Exhausted(now, s.key, s.cost))
}

// WaitFailed is the step after a wait that ended without the report in
// flight ending (timeout). The request is denied, to be asked again, when
// the region answered a call at any time from one request timeout before
// the wait began (answeredElsewhere): the region is reachable, and the
// report's call went to a replica that does not answer; else the
// on_failure policy decides.
//
// Why that window: the report a request waits on is often a call another
// request sent to a hung replica of several, which goes on for up to four
// request timeouts (AcquireCallTimeout) or a Sync's timeout. Its waiters
// send nothing meanwhile, so asking for an answer to a call sent after
// the wait began found none within the wait, and they went to the policy
// while the other replicas answered the instance's other keys (an open
// class admitted them, beyond b + r·t). An answer from before the wait
// began, though, is no evidence
// once it is old: at the start of an outage the waiters go to the policy
// one request timeout after the last answer, not for as long as the hung
// call lasts.
func (s *Slow) WaitFailed(now time.Time) Step {
	if !s.waitAt.IsZero() && s.c.brk.AnsweredAfter(s.waitAt.Add(-s.c.RequestTimeout(s.c.breakerTimeout))) {
		return s.answeredElsewhere(now)
	}
	return s.Fallback(now)
}

// ErrAbandoned ends a request whose caller gave up (its context ended)
// before the region answered. The request is not decided: the on_failure
// policies are for a region that cannot be reached, and a caller's
// deadline or cancellation says nothing of the region (deciding by the
// policy would let callers that give up early spend beyond the limit
// while the region is healthy).
var ErrAbandoned = errors.New("lease: the caller gave up before the region answered")

// Abandon ends the request because its caller gave up (see ErrAbandoned).
func (s *Slow) Abandon() Step { return s.decided(quota.Decision{}, ErrAbandoned) }

func (s *Slow) refused(what string) Step {
	st := s.decided(quota.Decision{}, fmt.Errorf("lease: region refused %s on key %s: %w", what, s.key, quota.ErrInvalid))
	st.Refused = true
	return st
}

// AcquireDone ends the acquire Next asked for at now, with the region's
// grants when it answered, and returns the next step: on an answer the
// request looks at its pool again; otherwise the policy decides.
func (s *Slow) AcquireDone(now time.Time, grants []*sluicev1.Grant, out Outcome) Step {
	t, brk := s.c.table, s.c.brk
	b := s.batch
	s.batch = nil
	if b == nil {
		panic("lease: AcquireDone without an acquire in flight")
	}
	if out == Answered || out == Refused || out == Conflict || out == KeyFailed {
		brk.ObserveRTT(b.SentAt(), now)
	}
	switch out {
	case Answered:
		brk.Success()
		applyErr := t.Apply(now, b, grants)
		st := s.Next(now)
		st.ApplyErr = applyErr
		return st
	case Refused:
		brk.Success()
		t.Reject(now, b)
		return s.refused("acquire")
	case Conflict:
		t.Failed(now, b)
		brk.Success()
	case KeyFailed:
		brk.Success()
		t.Failed(now, b)
		t.HoldOff(now, b)
	case Abandoned:
		t.Failed(now, b)
		brk.Abandon()
		return s.Abandon()
	default:
		t.Failed(now, b)
		if !brk.FailureOf(b.SentAt(), now) {
			return s.answeredElsewhere(now)
		}
	}
	return s.Fallback(now)
}

// AcquireGaveUp ends, at now, the request's wait for the acquire Next
// asked for before the call ended: the request's time ran out (Budget), or
// its caller gave up (abandoned; the step is then Abandon's). The call goes
// on, and whoever holds it reports its end to Core.SyncDone with the batch
// returned, as a background Sync's: an answer that comes late lands its
// grants in the pool for the requests after this one, is a round trip the
// breaker's wait learns from, and closes the breaker; only a call that
// ends with no answer (a transport error, or none within a background
// Sync's timeout) is evidence against the region.
//
// Why: the call used to be cut at the request's wait, and a call cut so
// counted toward opening the breaker. A burst of first requests on a
// loaded machine queues behind itself, so the last calls of a burst were
// cut, their answers never seen; the breaker opened, and every request
// went to its on_failure policy for the cooldown, again at the next burst,
// while the region answered (92% of 100,000 first requests, 25 at a time
// from each of 4 instances, at load 6-8; BENCHMARKS.md, "First decisions
// while Redis is healthy"). And the wait never learned the region's real
// round trip: only the answers within it were samples.
//
// The request itself is decided as a call that got no answer in time is:
// denied, to be asked again, when the region answered a call sent after
// this one meanwhile (answeredElsewhere), else by its on_failure policy.
func (s *Slow) AcquireGaveUp(now time.Time, abandoned bool) (Step, *Batch) {
	b := s.batch
	s.batch = nil
	if b == nil {
		panic("lease: AcquireGaveUp without an acquire in flight")
	}
	switch {
	case abandoned:
		return s.Abandon(), b
	case s.c.brk.AnsweredSince(b.SentAt()):
		return s.answeredElsewhere(now), b
	}
	return s.Fallback(now), b
}

// AcquireCallTimeout bounds a synchronous acquire's call, which goes on
// after its request gave up waiting (Slow.AcquireGaveUp): four request
// timeouts (RequestTimeout of base), within a background Sync's timeout,
// and never less than the request's wait. An answer within it lands and is
// a round trip the breaker's wait learns from; a call with no answer by
// then is evidence against the region: it has not answered for four times
// what its recent answers took (or the configured breaker timeout).
func (c *Core) AcquireCallTimeout(base time.Duration) time.Duration {
	t := c.RequestTimeout(base)
	return max(t, min(c.syncTimeout, 4*t))
}

// CheckDone ends the Check Next asked for at now, with the region's
// response when it answered, and decides the request.
func (s *Slow) CheckDone(now time.Time, resp *sluicev1.CheckResponse, out Outcome) Step {
	t, brk := s.c.table, s.c.brk
	if out == Answered || out == Refused || out == KeyFailed {
		brk.ObserveRTT(s.checkAt, now)
	}
	switch out {
	case Answered:
		brk.Success()
		return s.decided(t.ApplyCheck(now, s.key, s.cost, resp))
	case KeyFailed:
		brk.Success()
		t.HoldOffKey(now, s.key)
	case Refused:
		brk.Success()
		t.Forget(s.key)
		return s.refused("check")
	case Abandoned:
		brk.Abandon()
		return s.Abandon()
	default:
		if !brk.FailureOf(s.checkAt, now) {
			return s.answeredElsewhere(now)
		}
	}
	return s.Fallback(now)
}

// --- Owner loop. ---

// Expire enforces lease deadlines at now and returns how long the owner
// may wait before it must run again (Table.Expire; Refresh when no key
// holds a lease).
func (c *Core) Expire(now time.Time) time.Duration {
	if next := c.table.Expire(now); !next.IsZero() {
		return next.Sub(now)
	}
	return c.table.opts.Refresh
}

// BeforeSend is called by the owner right before it sends any background
// Sync or Release at now: it will be busy up to the sync timeout, so
// deadlines are enforced against that horizon (Table.ExpireFor).
func (c *Core) BeforeSend(now time.Time) { c.table.ExpireFor(now, c.syncTimeout) }

// SyncDone ends a background Sync batch (periodic, refill, or resending
// pending reports) at now, with the region's grants when it answered.
// A batch of several reports refused as invalid is split: send each part
// (BeforeSend, then SyncDone) to find the refused keys, which are
// forgotten. applyErr is set when grants did not match the reports (those
// reports stay pending).
func (c *Core) SyncDone(now time.Time, b *Batch, grants []*sluicev1.Grant, out Outcome) (split []*Batch, applyErr error) {
	if out == Answered || out == Refused || out == Conflict || out == KeyFailed {
		c.brk.ObserveRTT(b.SentAt(), now)
	}
	switch out {
	case Answered:
		c.brk.Success()
		return nil, c.table.Apply(now, b, grants)
	case Refused:
		c.brk.Success()
		if len(b.Reports) > 1 {
			return b.Split(now), nil
		}
		c.table.Reject(now, b)
		return nil, nil
	case Conflict, KeyFailed:
		// A KeyFailed Sync failed as a whole (a region that does not
		// answer per key): its keys are unknown, none is held off.
		c.brk.Success()
	default:
		c.brk.FailureOf(b.SentAt(), now)
	}
	c.table.Failed(now, b)
	return nil, nil
}

// ReleaseDone ends at now a Release sent at sent. Its keys are forgotten
// already; a Release that got no answer leaves their leases to expire,
// and counts against the region as a Sync's does: only when no call sent
// after it was answered (Breaker.FailureOf). Counted whatever the region
// answered, releases landing on one hung replica of several opened the
// breaker while the others answered every call.
func (c *Core) ReleaseDone(sent, now time.Time, out Outcome) {
	if out == Answered || out == Refused || out == Conflict || out == KeyFailed {
		c.brk.ObserveRTT(sent, now)
	}
	switch out {
	case Answered:
		c.brk.Success()
		c.table.Answered()
	case Refused, Conflict, KeyFailed:
		c.brk.Success()
	default:
		c.brk.FailureOf(sent, now)
	}
}

// SyncRound is one periodic Sync of the owner loop: its batches go out one
// after another, and once one finds the region unreachable the others are
// not sent (the region would only time them out too; their reports stay
// pending); the Release of the keys forgotten as idle goes last.
type SyncRound struct {
	c       *Core
	syncs   []*Batch
	release *Batch
	next    int
}

// PrepareSync starts the periodic Sync round at now (Table.PrepareSync).
func (c *Core) PrepareSync(now time.Time) *SyncRound {
	syncs, release := c.table.PrepareSync(now)
	return &SyncRound{c: c, syncs: syncs, release: release}
}

// Next returns the round's next batch to send, nil when the round is
// over: a Sync (then Sent), or last, when release, the Release of the idle
// keys (then ReleaseDone).
func (r *SyncRound) Next() (b *Batch, release bool) {
	switch {
	case r.next < len(r.syncs):
		b = r.syncs[r.next]
	case r.next == len(r.syncs) && r.release != nil:
		b, release = r.release, true
	default:
		return nil, false
	}
	r.next++
	return b, release
}

// Sent ends the Sync batch Next returned last (see Core.SyncDone) and
// returns what to send of its split parts, and the batches of the round
// that will not be sent because the region is unreachable (they are ended
// already: their keys are no longer in flight).
func (r *SyncRound) Sent(now time.Time, b *Batch, grants []*sluicev1.Grant, out Outcome) (split []*Batch, skipped []*Batch, applyErr error) {
	split, applyErr = r.c.SyncDone(now, b, grants, out)
	if (out == Unreachable || out == Abandoned) && r.next < len(r.syncs) {
		skipped = r.syncs[r.next:]
		for _, rest := range skipped {
			r.c.table.Failed(now, rest)
		}
		r.next = len(r.syncs)
	}
	return split, skipped, applyErr
}

// GiveBackDue reports, once, that a grant applied since the last call found
// a key's pool above the batch cap of more live instances than before:
// the owner should run PrepareRefill (as after a kick), whose report gives
// the excess back to the peers waiting for it.
func (c *Core) GiveBackDue() bool { return c.table.giveBackDue.Swap(false) }

// PrepareFalls builds the owner loop's early Sync of the keys whose demand
// fell since their last report (Table.PrepareFalls), nil when none; run
// every FallCheckEvery, and send it and end it as an early refill
// (SyncDone).
func (c *Core) PrepareFalls(now time.Time) *Batch { return c.table.PrepareFalls(now) }

// PrepareRefill builds the owner loop's early refill at now (nil when no
// key is at its low-water mark). The owner calls it when a kick finds
// RefillWait at zero, and sends the batch and ends it (SyncDone).
func (c *Core) PrepareRefill(now time.Time) *Batch {
	b := c.table.PrepareRefill(now)
	if b != nil {
		c.lastRefill = now
	}
	return b
}

// RefillWait is how long a kick (a key crossed its low-water mark) at now
// waits before the owner runs PrepareRefill, so that a burst of keys
// crossing their marks shares one RPC: what is left of RefillSpacing since
// the last early refill that sent something (none after a refill that
// sent nothing: a key that crossed its mark while its report was in
// flight must not wait a spacing for an RPC that never happened). When a
// key crossed a cap-held mark since the last PrepareRefill, what is left
// of the shorter CapHeldSpacing: while that report waits, its region's
// bucket sits at its cap and loses its refill (capHeldWater), a token per
// millisecond for a key of 1000/s, so the full spacing cost a hot key
// served through the Envoy endpoint about 0.4% of b + r·t in its first 5 s
// (BENCHMARKS.md). 0 means run PrepareRefill now.
func (c *Core) RefillWait(now time.Time) time.Duration {
	if c.lastRefill.IsZero() {
		return 0
	}
	since := now.Sub(c.lastRefill)
	wait := RefillSpacing(c.table.opts.Refresh) - since
	if c.table.capHeldDue.Load() {
		wait = min(wait, CapHeldSpacing(c.table.opts.Refresh)-since)
	}
	return max(wait, 0)
}
