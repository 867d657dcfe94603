package lease

import (
	"errors"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// newTestCore is a Core over a fresh test table (Refresh 1s, so a Sync
// timeout of 500ms by default) and a breaker opening after 3 failures for
// 1s; breakerTimeout 0 leaves the core without one.
func newTestCore(t *testing.T, syncTimeout, breakerTimeout time.Duration, mod ...func(*TableOptions)) (*Core, *Table, *Breaker) {
	t.Helper()
	tb := newTestTable(t, mod...)
	brk := NewBreaker(DefaultBreakerFailures, DefaultBreakerCooldown)
	c := NewCore(tb, brk, syncTimeout)
	if breakerTimeout > 0 {
		c.WithBreakerTimeout(breakerTimeout)
	}
	return c, tb, brk
}

// answerLater has the region answer, at answered, an acquire of a key of
// its own sent at sent (a call of another request, to a replica that
// answers).
func answerLater(t *testing.T, c *Core, sent, answered time.Time) {
	t.Helper()
	later := c.Slow(quota.Key{Tenant: "later", Class: "read"}, 1)
	st := stepTo(t, "a later acquire", later.Next(sent), DoAcquire)
	if st = later.AcquireDone(answered, grantBatch(st.Batch, 1), Answered); st.Do != DoDecided || !st.Decision.Allowed {
		t.Fatalf("the later acquire, answered: %+v", st)
	}
}

// stepTo fails unless st asks for do.
func stepTo(t *testing.T, what string, st Step, do Do) Step {
	t.Helper()
	if st.Do != do {
		t.Fatalf("%s: step %+v, want Do %d", what, st, do)
	}
	return st
}

// grantBatch answers every report of b with granted tokens.
func grantBatch(b *Batch, granted int64) []*sluicev1.Grant {
	gs := make([]*sluicev1.Grant, len(b.Reports))
	for i, r := range b.Reports {
		gs[i] = regionGrant(r, granted)
	}
	return gs
}

// fastAnswers records n round trips of 1ms in brk.
func fastAnswers(brk *Breaker, n int) {
	for i := range n {
		at := t0.Add(-time.Hour + time.Duration(i)*time.Second)
		brk.ObserveRTT(at, at.Add(time.Millisecond))
	}
}

// TestCoreRequestBudget: a request's wait is the core's breaker timeout
// (or the caller's base when the core has none), counted from its first
// round, however small the configured timeout.
func TestCoreRequestBudget(t *testing.T) {
	c, _, _ := newTestCore(t, 0, 0)
	s := c.Slow(kW, 1)
	if got := s.Budget(t0, 50*time.Millisecond); got != 50*time.Millisecond {
		t.Fatalf("core without a breaker timeout: budget %v, want the caller's base 50ms", got)
	}
	for _, bt := range []time.Duration{time.Nanosecond, 50 * time.Millisecond} {
		c, _, _ := newTestCore(t, 0, bt)
		s := c.Slow(kW, 1)
		if got := s.Budget(t0, 0); got != bt {
			t.Fatalf("breaker timeout %v: budget before the first round %v", bt, got)
		}
	}
	c, _, _ = newTestCore(t, 0, 50*time.Millisecond)
	s = c.Slow(kW, 1)
	stepTo(t, "first round", s.Next(t0), DoAcquire)
	if got := s.Budget(t0.Add(20*time.Millisecond), 0); got != 30*time.Millisecond {
		t.Fatalf("20ms after the first round: budget %v, want 30ms", got)
	}
}

// TestCoreWaitsAreBoundedBySyncTimeout: a request's wait grows with slow
// answers up to the Sync timeout: the configured one however small, else
// half the refresh.
func TestCoreWaitsAreBoundedBySyncTimeout(t *testing.T) {
	for _, tc := range []struct {
		sync, base, want time.Duration
	}{
		{sync: 0, base: 50 * time.Millisecond, want: 500 * time.Millisecond},
		{sync: 200 * time.Millisecond, base: 50 * time.Millisecond, want: 200 * time.Millisecond},
		{sync: time.Nanosecond, base: 0, want: time.Nanosecond},
	} {
		c, _, brk := newTestCore(t, tc.sync, 0)
		brk.ObserveRTT(t0, t0.Add(10*time.Second))
		if got := c.RequestTimeout(tc.base); got != tc.want {
			t.Errorf("sync timeout %v, answers in 10s: request timeout %v, want %v", tc.sync, got, tc.want)
		}
	}
}

// TestCoreBeforeSendEnforcesAgainstSyncTimeout: before a background send
// the owner stops the clock-free path on every key whose guard time falls
// within the Sync timeout it may then be blocked for, and on no other.
func TestCoreBeforeSendEnforcesAgainstSyncTimeout(t *testing.T) {
	// Acquired at t0 with a 5s TTL: the guard time is t0+2.5s.
	at := t0.Add(2200 * time.Millisecond)
	for _, tc := range []struct {
		sync  time.Duration
		check bool
	}{
		{sync: 0, check: true}, // 500ms
		{sync: 100 * time.Millisecond, check: false},
		{sync: time.Nanosecond, check: false},
	} {
		c, tb, _ := newTestCore(t, tc.sync, 0)
		acquire(t, tb, t0, t0, kW, 10, 10)
		c.BeforeSend(at)
		if got := state(t, tb, kW).CheckClock; got != tc.check {
			t.Errorf("sync timeout %v, 300ms before the guard time: checkClock %v, want %v", tc.sync, got, tc.check)
		}
	}
}

// TestCoreRequestGivesUpAfterTwoAcquires: a request whose acquires keep
// bringing fewer tokens than it costs is denied (not degraded) after
// MaxSyncAcquires of them; the same Slow reused for the next request
// starts counting again.
func TestCoreRequestGivesUpAfterTwoAcquires(t *testing.T) {
	c, _, _ := newTestCore(t, 0, 0)
	s := c.Slow(kW, 3)
	for req := range 2 {
		st := s.Next(t0)
		for i := range MaxSyncAcquires {
			st = stepTo(t, "acquire", st, DoAcquire)
			// Other requests' share: the region grants 1 of the 3 asked.
			if req == 1 {
				st = s.AcquireDone(t0, grantBatch(st.Batch, 0), Answered)
			} else {
				st = s.AcquireDone(t0, grantBatch(st.Batch, 1), Answered)
			}
			if i < MaxSyncAcquires-1 && st.Do != DoAcquire {
				t.Fatalf("request %d: after acquire %d: step %+v, want another acquire", req, i+1, st)
			}
		}
		st = stepTo(t, "after the last acquire", st, DoDecided)
		if st.Decision.Allowed || st.Degraded || st.Err != nil || st.Decision.RetryAfter <= 0 {
			t.Fatalf("request %d: decision %+v degraded %v err %v: want denied with a retry time, not degraded", req, st.Decision, st.Degraded, st.Err)
		}
	}
}

// TestCoreRequestWaitsAtMostMaxSlowRounds: a request waiting for another
// one's report in flight looks again at most MaxSlowRounds times, then is
// denied; the same Slow reused for the next request waits as long again.
// Without a breaker timeout set, time alone does not end the wait.
func TestCoreRequestWaitsAtMostMaxSlowRounds(t *testing.T) {
	c, _, _ := newTestCore(t, 0, 0)
	first := c.Slow(kW, 1)
	stepTo(t, "first request", first.Next(t0), DoAcquire)
	s := c.Slow(kW, 1)
	for req := range 2 {
		waits := 0
		st := s.Next(t0)
		for st.Do == DoWait && waits <= 2*MaxSlowRounds {
			waits++
			st = s.Next(t0.Add(time.Duration(waits) * time.Second))
		}
		if waits != MaxSlowRounds || st.Do != DoDecided || st.Degraded || st.Decision.Allowed {
			t.Fatalf("request %d: %d waits then %+v; want %d waits then a denial", req, waits, st, MaxSlowRounds)
		}
	}
}

// TestCoreWaitEndsAtTheBreakerTimeout: a request that waits for another
// one's report in flight is decided by its on_failure policy once its
// breaker timeout has passed since it began waiting, not a nanosecond
// earlier, however short the timeout.
func TestCoreWaitEndsAtTheBreakerTimeout(t *testing.T) {
	for _, bt := range []time.Duration{time.Nanosecond, 50 * time.Millisecond} {
		c, _, _ := newTestCore(t, 0, bt)
		first := c.Slow(kW, 1)
		stepTo(t, "first request", first.Next(t0), DoAcquire)
		s := c.Slow(kW, 1)
		stepTo(t, "second request", s.Next(t0), DoWait)
		stepTo(t, "wait, last instant", s.Next(t0.Add(bt-time.Nanosecond)), DoWait)
		st := stepTo(t, "wait at the timeout", s.Next(t0.Add(bt)), DoDecided)
		if !st.Degraded {
			t.Fatalf("breaker timeout %v, at it: %+v, want the on_failure policy's decision", bt, st)
		}
	}
}

// TestCoreAcquireAnsweredLateEndsTheWait: an acquire answered after the
// request's breaker timeout (the region's recent answers fast) with too
// few tokens does not start another acquire. The region answered, so it
// is denied, to be asked again, not decided by the on_failure policy.
func TestCoreAcquireAnsweredLateEndsTheWait(t *testing.T) {
	const bt = 50 * time.Millisecond
	c, _, brk := newTestCore(t, 0, bt)
	fastAnswers(brk, rttSamples)
	s := c.Slow(kW, 3)
	st := stepTo(t, "acquire", s.Next(t0), DoAcquire)
	st = s.AcquireDone(t0.Add(60*time.Millisecond), grantBatch(st.Batch, 1), Answered)
	if st.Do != DoDecided || st.Degraded || st.Decision.Allowed || st.Decision.RetryAfter <= 0 {
		t.Fatalf("acquire answered after 60ms with 1 of 3 tokens: %+v, want denied with a retry, not the on_failure policy's decision", st)
	}
}

// TestCoreOpenBreakerDecidesAtOnce: while the breaker is open a request
// that would ask the region (acquire or check) is decided by the key's
// on_failure policy without a round trip, and its key is not in flight;
// a closed breaker lets them ask.
func TestCoreOpenBreakerDecidesAtOnce(t *testing.T) {
	for _, key := range []quota.Key{kW, kExp} {
		c, tb, brk := newTestCore(t, 0, 50*time.Millisecond)
		s := c.Slow(key, 1)
		want := DoAcquire
		if key == kExp {
			want = DoCheck
		}
		st := stepTo(t, key.String()+" closed breaker", s.Next(t0), want)
		if want == DoAcquire {
			s.AcquireDone(t0, nil, Unreachable)
		} else {
			s.CheckDone(t0, nil, Unreachable)
		}
		for range DefaultBreakerFailures - 1 {
			brk.Failure(t0)
		}
		if !brk.Open() {
			t.Fatal("breaker not open")
		}
		st = stepTo(t, key.String()+" open breaker", s.Next(t0.Add(time.Millisecond)), DoDecided)
		if !st.Degraded || st.Batch != nil {
			t.Fatalf("%s, open breaker: %+v, want degraded without a batch", key, st)
		}
		if ks, ok := tb.State(key); ok && ks.InFlight {
			t.Fatalf("%s in flight while the breaker is open", key)
		}
	}
}

// TestCoreAbandonedProbeLetsTheNextRequestProbe: the one request a
// half-open breaker lets through, abandoned by its caller, ends without a
// verdict on the region: its report is no longer in flight, and the next
// request probes in its place rather than being decided by the policy.
func TestCoreAbandonedProbeLetsTheNextRequestProbe(t *testing.T) {
	for _, key := range []quota.Key{kW, kExp} {
		c, tb, brk := newTestCore(t, 0, 50*time.Millisecond)
		want := DoAcquire
		if key == kExp {
			want = DoCheck
		}
		for range DefaultBreakerFailures {
			brk.Failure(t0)
		}
		if !brk.Open() {
			t.Fatal("breaker not open")
		}
		at := t0.Add(DefaultBreakerCooldown)
		s := c.Slow(key, 1)
		stepTo(t, key.String()+" probe", s.Next(at), want)
		var st Step
		if want == DoAcquire {
			st = s.AcquireDone(at, nil, Abandoned)
		} else {
			st = s.CheckDone(at, nil, Abandoned)
		}
		if !errors.Is(st.Err, ErrAbandoned) || st.Degraded {
			t.Fatalf("%s, probe abandoned: %+v, want ErrAbandoned, not degraded", key, st)
		}
		if ks, ok := tb.State(key); ok && ks.InFlight {
			t.Fatalf("%s in flight after its request was abandoned", key)
		}
		next := c.Slow(key, 1)
		stepTo(t, key.String()+" next request", next.Next(at), want)
	}
}

// TestCoreRefusedCheckIsAnError: a strict Check the region refuses as
// invalid input ends the request with an error wrapping quota.ErrInvalid
// (not a decision by the policy: the region answered), closes the breaker
// it probed and forgets the key.
func TestCoreRefusedCheckIsAnError(t *testing.T) {
	c, tb, brk := newTestCore(t, 0, 50*time.Millisecond)
	for range DefaultBreakerFailures {
		brk.Failure(t0)
	}
	at := t0.Add(DefaultBreakerCooldown)
	s := c.Slow(kExp, 1)
	stepTo(t, "check", s.Next(at), DoCheck)
	st := s.CheckDone(at, nil, Refused)
	if st.Do != DoDecided || !errors.Is(st.Err, quota.ErrInvalid) || !st.Refused || st.Degraded || st.Decision.Allowed {
		t.Fatalf("refused check: %+v; want an error wrapping quota.ErrInvalid, marked refused, not degraded", st)
	}
	if brk.Open() {
		t.Fatal("breaker still open after the region answered the probe")
	}
	if _, ok := tb.State(kExp); ok {
		t.Fatalf("%s still held after the region refused it", kExp)
	}
}

// TestCoreLearnsRoundTripsOfAnswersOnly: every answer (grants, a refusal,
// a conflict) lengthens a request's wait after slow round trips; an RPC
// that got no answer, or that its caller abandoned, does not.
func TestCoreLearnsRoundTripsOfAnswersOnly(t *testing.T) {
	const bt, slowRTT = 50 * time.Millisecond, 100 * time.Millisecond
	const longer = 4 * slowRTT
	outcomes := []struct {
		out  Outcome
		want time.Duration
	}{
		{Answered, longer}, {Refused, longer}, {Conflict, longer}, {Unreachable, bt}, {Abandoned, bt},
	}
	for _, o := range outcomes {
		// A request's acquire.
		c, _, _ := newTestCore(t, 0, bt)
		s := c.Slow(kW, 1)
		st := stepTo(t, "acquire", s.Next(t0), DoAcquire)
		var gs []*sluicev1.Grant
		if o.out == Answered {
			gs = grantBatch(st.Batch, 1)
		}
		s.AcquireDone(t0.Add(slowRTT), gs, o.out)
		if got := c.RequestTimeout(bt); got != o.want {
			t.Errorf("acquire ended %d after %v: request timeout %v, want %v", o.out, slowRTT, got, o.want)
		}

		// A background Sync.
		c, tb, _ := newTestCore(t, 0, bt)
		acquire(t, tb, t0, t0, kW, 1, 1)
		round := c.PrepareSync(t0.Add(time.Second))
		b, _ := round.Next()
		gs = nil
		if o.out == Answered {
			gs = grantBatch(b, 0)
		}
		round.Sent(t0.Add(time.Second+slowRTT), b, gs, o.out)
		if got := c.RequestTimeout(bt); got != o.want {
			t.Errorf("sync ended %d after %v: request timeout %v, want %v", o.out, slowRTT, got, o.want)
		}
	}
	// A strict key's check: the region answers or refuses, or not.
	for _, o := range outcomes {
		if o.out == Conflict {
			continue // checks carry no report to conflict
		}
		c, _, _ := newTestCore(t, 0, bt)
		s := c.Slow(kExp, 1)
		stepTo(t, "check", s.Next(t0), DoCheck)
		var resp *sluicev1.CheckResponse
		if o.out == Answered {
			resp = &sluicev1.CheckResponse{Allowed: true, Limit: 10, Remaining: 9}
		}
		s.CheckDone(t0.Add(slowRTT), resp, o.out)
		if got := c.RequestTimeout(bt); got != o.want {
			t.Errorf("check ended %d after %v: request timeout %v, want %v", o.out, slowRTT, got, o.want)
		}
	}
}

// TestCoreExpireWakeups: the owner sleeps a refresh when no key holds a
// lease, else until the next key's guard time.
func TestCoreExpireWakeups(t *testing.T) {
	c, tb, _ := newTestCore(t, 0, 0)
	if got := c.Expire(t0); got != time.Second {
		t.Fatalf("no lease: owner waits %v, want the refresh", got)
	}
	acquire(t, tb, t0, t0, kW, 10, 10)
	if got := c.Expire(t0.Add(time.Second)); got != 1500*time.Millisecond {
		t.Fatalf("lease to t0+5s, at t0+1s: owner waits %v, want 1.5s (until deadline − ttl/2)", got)
	}
}

// TestCoreRefusedSyncIsolatesTheRefusedKey: a Sync of one report refused
// as invalid forgets that key; a Sync of several is split into one batch
// per report to find it.
func TestCoreRefusedSyncIsolatesTheRefusedKey(t *testing.T) {
	for _, keys := range [][]quota.Key{{kW}, {kW, kR}} {
		c, tb, _ := newTestCore(t, 0, 0)
		for _, k := range keys {
			acquire(t, tb, t0, t0, k, 1, 1)
		}
		round := c.PrepareSync(t0.Add(time.Second))
		b, _ := round.Next()
		split, _, _ := round.Sent(t0.Add(time.Second), b, nil, Refused)
		if len(keys) == 1 {
			if split != nil {
				t.Fatalf("one refused report split into %d batches", len(split))
			}
			if _, ok := tb.State(kW); ok {
				t.Fatal("the key of a refused report is still held")
			}
			continue
		}
		if len(split) != len(keys) {
			t.Fatalf("%d refused reports split into %d batches, want one each", len(keys), len(split))
		}
		for i, p := range split {
			if len(p.Reports) != 1 || p.Keys()[0] != b.Keys()[i] {
				t.Fatalf("split part %d: keys %v, want [%s]", i, p.Keys(), b.Keys()[i])
			}
		}
	}
}

// TestCoreSyncRoundOrder: a Sync round sends its batches in order, then
// the Release of the keys forgotten as idle, then is over; an answered
// or conflicting batch lets the others go, while one that found the region
// unreachable (or was abandoned) ends the round's other Syncs unsent, with
// their keys no longer in flight.
func TestCoreSyncRoundOrder(t *testing.T) {
	keys := []quota.Key{kW, kR, {Tenant: "acme", Class: "open"}}
	idle := quota.Key{Tenant: "idle", Class: "write"}
	setup := func(withIdle bool) (*Core, *Table, *SyncRound) {
		c, tb, _ := newTestCore(t, 0, 0, func(o *TableOptions) { o.MaxReportsPerSync = 1; o.IdleTimeout = 3 * time.Second })
		if withIdle {
			acquire(t, tb, t0, t0, idle, 1, 1)
		}
		for _, k := range keys {
			acquire(t, tb, t0.Add(4*time.Second), t0.Add(4*time.Second), k, 1, 1)
		}
		return c, tb, c.PrepareSync(t0.Add(4 * time.Second))
	}

	_, _, round := setup(true)
	synced := map[quota.Key]bool{}
	for i := range keys {
		b, release := round.Next()
		if b == nil || release || b.Keys()[0] == idle || synced[b.Keys()[0]] {
			t.Fatalf("batch %d: %v release %v (synced before: %v), want the Sync of another busy key", i, b, release, synced)
		}
		synced[b.Keys()[0]] = true
		round.Sent(t0.Add(4*time.Second), b, grantBatch(b, 0), Answered)
	}
	if b, release := round.Next(); b == nil || !release || b.Keys()[0] != idle {
		t.Fatalf("after the Syncs: %v release %v, want the Release of the idle key", b, release)
	}
	if b, release := round.Next(); b != nil || release {
		t.Fatalf("after the Release: %v release %v, want the round over", b, release)
	}

	for _, out := range []Outcome{Conflict, Unreachable, Abandoned} {
		_, tb, round := setup(false)
		b, _ := round.Next()
		_, skipped, _ := round.Sent(t0.Add(4*time.Second), b, nil, out)
		next, _ := round.Next()
		if out == Conflict {
			if len(skipped) != 0 || next == nil || next.Keys()[0] == b.Keys()[0] {
				t.Fatalf("after a conflict: skipped %d, next %v; want the next Sync", len(skipped), next)
			}
			continue
		}
		if len(skipped) != len(keys)-1 || next != nil {
			t.Fatalf("outcome %d: skipped %d batches, next %v; want the other %d skipped and the round over", out, len(skipped), next, len(keys)-1)
		}
		for _, k := range keys {
			if state(t, tb, k).InFlight {
				t.Fatalf("outcome %d: %s still in flight", out, k)
			}
		}
	}
}

// TestCoreRefillHold: an early refill holds further kicks for the refill
// spacing; when no key is at its low-water mark nothing is sent and
// nothing held.
func TestCoreRefillHold(t *testing.T) {
	c, tb, _ := newTestCore(t, 0, 0)
	if w := c.RefillWait(t0); w != 0 {
		t.Fatalf("no refill yet: wait %v, want 0", w)
	}
	if b := c.PrepareRefill(t0); b != nil {
		t.Fatalf("no key: refill %v, want none", b)
	}
	if w := c.RefillWait(t0); w != 0 {
		t.Fatalf("after a refill that sent nothing: wait %v, want 0", w)
	}
	acquire(t, tb, t0, t0, kW, 1, 1)
	allow(t, tb, t0, kW, 1)
	if b := c.PrepareRefill(t0); b == nil {
		t.Fatal("empty pool: no refill")
	}
	spacing := RefillSpacing(time.Second)
	for _, d := range []time.Duration{0, 10 * time.Millisecond, spacing - time.Nanosecond, spacing, time.Second} {
		if got, want := c.RefillWait(t0.Add(d)), max(spacing-d, 0); got != want {
			t.Errorf("%v after the refill: wait %v, want %v", d, got, want)
		}
	}
}

// TestCapHeldCrossingWaitsTheShorterSpacing: a key that crosses its
// cap-held mark (its region's bucket and its pool fill the cap, so the
// bucket loses its refill until the report) waits only CapHeldSpacing
// after the last early refill, not RefillSpacing; an ordinary crossing of
// another key waits the whole spacing, and once PrepareRefill has run the
// shorter wait is gone.
func TestCapHeldCrossingWaitsTheShorterSpacing(t *testing.T) {
	c, tb, _ := newTestCore(t, 0, 0)
	now := startDraining(t, tb) // kW: pool 930, its cap-held mark at 868
	other := kW
	other.Tenant = "other"
	acquire(t, tb, now, now, other, 1, 1)
	allow(t, tb, now, other, 1)
	if b := c.PrepareRefill(now); b == nil || len(b.Reports) != 1 || b.Reports[0].Key.Tenant != "other" {
		t.Fatalf("refill %+v, want one report, for %s", b, other)
	}
	sent := now
	spacing, short := RefillSpacing(time.Second), CapHeldSpacing(time.Second)
	if short != 5*time.Millisecond || short >= spacing {
		t.Fatalf("CapHeldSpacing(1s) = %v, want 5ms, below RefillSpacing %v", short, spacing)
	}
	// Spend kW at 2000/s down to its mark: the 62nd token crosses it.
	for i := range 62 {
		now = now.Add(500 * time.Microsecond)
		_, act := allow(t, tb, now, kW, 1)
		if crossed := act == ActRefill; crossed != (i == 61) {
			t.Fatalf("token %d: action %v", i+1, act)
		}
		if i == 60 {
			if got, want := c.RefillWait(now), spacing-now.Sub(sent); got != want {
				t.Fatalf("before the crossing: wait %v, want %v", got, want)
			}
		}
	}
	if got := c.RefillWait(now); got != 0 || now.Sub(sent) < short {
		t.Fatalf("%v after the refill, crossing a cap-held mark: wait %v, want 0", now.Sub(sent), got)
	}
	if got, want := c.RefillWait(sent.Add(2*time.Millisecond)), short-2*time.Millisecond; got != want {
		t.Fatalf("2ms after the refill with a cap-held mark crossed: wait %v, want %v", got, want)
	}
	b := c.PrepareRefill(now)
	if b == nil || len(b.Reports) != 1 || b.Reports[0].Used != 100+62 {
		t.Fatalf("early refill %+v, want one report of the 162 tokens spent", b)
	}
	if got := c.RefillWait(now.Add(time.Millisecond)); got != spacing-time.Millisecond {
		t.Fatalf("after the cap-held report: wait %v, want the whole spacing less 1ms", got)
	}
}

// TestOrdinaryCrossingWaitsTheWholeSpacing: a key crossing its usual
// low-water mark (no cap-held mark above it) makes the next early refill
// wait what is left of the whole RefillSpacing; only a cap-held crossing
// cuts it to CapHeldSpacing. Counting an ordinary crossing as cap-held
// would send one RPC per key that crossed, every 5 ms, where the spacing
// exists to batch them.
func TestOrdinaryCrossingWaitsTheWholeSpacing(t *testing.T) {
	c, tb, _ := newTestCore(t, 0, 0)
	a, b := kW, kW
	a.Tenant, b.Tenant = "a", "b"
	now := t0
	acquire(t, tb, now, now, a, 1, 1)
	acquire(t, tb, now, now, b, 1, 1)
	if _, act := allow(t, tb, now, a, 1); act != ActRefill {
		t.Fatalf("a's last token: action %v, want a refill", act)
	}
	if batch := c.PrepareRefill(now); batch == nil || len(batch.Reports) != 1 || batch.Reports[0].Key.Tenant != "a" {
		t.Fatalf("refill %+v, want one report, for a", batch)
	}
	sent := now
	now = now.Add(2 * time.Millisecond)
	if _, act := allow(t, tb, now, b, 1); act != ActRefill {
		t.Fatalf("b's last token: action %v, want a refill", act)
	}
	if st := state(t, tb, b); st.LowWater != 0 {
		t.Fatalf("b's low-water mark %d, want the usual 0", st.LowWater)
	}
	if got, want := c.RefillWait(now), RefillSpacing(time.Second)-now.Sub(sent); got != want {
		t.Fatalf("ordinary crossing 2ms after a refill: wait %v, want the rest of the whole spacing, %v", got, want)
	}
}

// TestDecideRules pins the small rules the Client and the simulator share:
// when a request gives up, how far apart refills go, the default Sync
// timeout.
func TestDecideRules(t *testing.T) {
	for _, tc := range []struct {
		acquires, rounds int
		want             bool
	}{
		{0, 0, false}, {1, 5, false}, {2, 0, true}, {0, 6, true}, {3, 7, true},
	} {
		if got := GiveUp(tc.acquires, tc.rounds); got != tc.want {
			t.Errorf("GiveUp(%d acquires, %d rounds) = %v, want %v", tc.acquires, tc.rounds, got, tc.want)
		}
	}
	for _, tc := range []struct{ refresh, want time.Duration }{
		{time.Second, 50 * time.Millisecond},
		{200 * time.Millisecond, 10 * time.Millisecond},
		{50 * time.Millisecond, 5 * time.Millisecond},
		{10 * time.Millisecond, 5 * time.Millisecond},
	} {
		if got := RefillSpacing(tc.refresh); got != tc.want {
			t.Errorf("RefillSpacing(%v) = %v, want %v", tc.refresh, got, tc.want)
		}
	}
	for _, tc := range []struct{ refresh, want time.Duration }{
		{2 * time.Second, 10 * time.Millisecond},
		{time.Second, 5 * time.Millisecond},
		{200 * time.Millisecond, 5 * time.Millisecond},
		{10 * time.Millisecond, 5 * time.Millisecond},
	} {
		if got := CapHeldSpacing(tc.refresh); got != tc.want {
			t.Errorf("CapHeldSpacing(%v) = %v, want %v", tc.refresh, got, tc.want)
		}
	}
	if got := DefaultSyncTimeout(time.Second); got != 500*time.Millisecond {
		t.Errorf("DefaultSyncTimeout(1s) = %v, want 500ms", got)
	}
}

// TestCoreCallUnansweredWhileALaterOneWasAnsweredIsDenied: a request whose
// acquire or strict Check got no answer while the region answered a call
// sent after it is denied, to be retried after about a round trip, not
// decided by its on_failure policy (the region can decide: one replica of
// several hangs); neither that failure nor a background Sync's so
// contradicted counts against the breaker, which here opens at the first
// failure. With no later call answered, the policy decides.
func TestCoreCallUnansweredWhileALaterOneWasAnsweredIsDenied(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	tb := newTestTable(t)
	brk := NewBreaker(1, time.Second)
	c := NewCore(tb, brk, 0)
	c.WithBreakerTimeout(300 * time.Millisecond)
	acquire(t, tb, ms(0), ms(0), kW, 1, 1) // a lease for the background Sync
	syncs, _ := tb.PrepareSync(ms(1))

	acq := c.Slow(kR, 1)
	stepTo(t, "acquire", acq.Next(ms(1)), DoAcquire)
	check := c.Slow(kExp, 1)
	stepTo(t, "check", check.Next(ms(1)), DoCheck)

	answerLater(t, c, ms(2), ms(5))

	for _, r := range []struct {
		what string
		st   Step
	}{
		{"acquire", acq.AcquireDone(ms(301), nil, Unreachable)},
		{"check", check.CheckDone(ms(301), nil, Unreachable)},
	} {
		d := r.st.Decision
		if r.st.Do != DoDecided || r.st.Err != nil || r.st.Degraded || d.Degraded || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
			t.Errorf("%s unanswered, a later call answered: %+v; want denied with a retry of about a round trip, not degraded", r.what, r.st)
		}
	}
	if _, err := c.SyncDone(ms(501), syncs[0], nil, Unreachable); err != nil {
		t.Fatal(err)
	}
	if brk.Open() {
		t.Fatal("the breaker opened on calls sent before one the region answered")
	}

	// Sent after the last answer, an unanswered acquire is evidence: the
	// policy decides it (local), and the breaker opens.
	alone := c.Slow(quota.Key{Tenant: "alone", Class: "read"}, 1)
	st := stepTo(t, "an acquire after the last answer", alone.Next(ms(600)), DoAcquire)
	if st = alone.AcquireDone(ms(900), nil, Unreachable); st.Do != DoDecided || !st.Degraded || !st.Decision.Degraded {
		t.Errorf("an acquire unanswered, none sent later answered: %+v; want decided by the policy", st)
	}
	if !brk.Open() {
		t.Error("the breaker stayed closed on a failure no later answer contradicts")
	}
}

// TestCoreEveryAnswerClosesTheBreakerAndAnUnansweredReleaseCounts: an
// acquire or background Sync the region refused as conflicting, and a
// Release it answered in any way, reached the region: each resets the
// consecutive failures as a success does (a breaker of threshold 2 with
// one failure behind it stays closed at the next), while a Release that
// got no answer is a failure like any call's (a breaker of threshold 1
// opens).
func TestCoreEveryAnswerClosesTheBreakerAndAnUnansweredReleaseCounts(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct {
		name   string
		answer func(t *testing.T, c *Core, tb *Table)
	}{
		{"acquire refused as a conflict", func(t *testing.T, c *Core, tb *Table) {
			s := c.Slow(kR, 1)
			stepTo(t, "acquire", s.Next(ms(10)), DoAcquire)
			s.AcquireDone(ms(20), nil, Conflict)
		}},
		{"background Sync refused as a conflict", func(t *testing.T, c *Core, tb *Table) {
			acquire(t, tb, ms(10), ms(10), kW, 1, 1)
			syncs, _ := tb.PrepareSync(ms(11))
			if len(syncs) == 0 {
				t.Fatal("no Sync to send")
			}
			c.BeforeSend(ms(11))
			c.SyncDone(ms(20), syncs[0], nil, Conflict)
		}},
		{"Release answered", func(t *testing.T, c *Core, tb *Table) { c.ReleaseDone(ms(15), ms(20), Answered) }},
		{"Release refused", func(t *testing.T, c *Core, tb *Table) { c.ReleaseDone(ms(15), ms(20), Refused) }},
		{"Release refused as a conflict", func(t *testing.T, c *Core, tb *Table) { c.ReleaseDone(ms(15), ms(20), Conflict) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTestTable(t)
			brk := NewBreaker(2, time.Second)
			c := NewCore(tb, brk, 0)
			brk.Failure(ms(0))
			tc.answer(t, c, tb)
			brk.Failure(ms(30))
			if brk.Open() {
				t.Fatal("open after a failure, the region's answer and one more failure: the answer did not reset the count")
			}
		})
	}
	brk := NewBreaker(1, time.Second)
	NewCore(newTestTable(t), brk, 0).ReleaseDone(ms(0), ms(0), Unreachable)
	if !brk.Open() {
		t.Fatal("a Release that got no answer did not count against a breaker of threshold 1")
	}

	// A Release unanswered while a call sent after it was answered (it
	// went to one hung replica of several) is no evidence against the
	// region.
	brk = NewBreaker(1, time.Second)
	c := NewCore(newTestTable(t), brk, 0)
	answerLater(t, c, ms(10), ms(12))
	c.ReleaseDone(ms(5), ms(505), Unreachable)
	if brk.Open() {
		t.Fatal("a Release unanswered while a call sent after it was answered opened the breaker")
	}
}

// TestCoreWaitOnACallUnansweredWhileALaterOneWasAnsweredIsDenied: a
// request that waits on its key's report in flight (another request's
// acquire, or a refill, sent to a hung replica of several) and whose wait
// ends with the report unanswered is denied, to be retried after about a
// round trip, not decided by the on_failure policy (an open class admitted
// everything, and local spent its bucket, while the other replicas
// answered), when the region answered a call during its wait or within
// one request timeout before it began (it sends nothing while it waits,
// so a wait that began after the last answer found none in time); when
// the last answer is older than that, the policy decides.
func TestCoreWaitOnACallUnansweredWhileALaterOneWasAnsweredIsDenied(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	c, _, brk := newTestCore(t, 0, 50*time.Millisecond)
	fastAnswers(brk, rttSamples)

	first := c.Slow(kR, 1)
	stepTo(t, "the acquire, to a hung replica", first.Next(ms(0)), DoAcquire)
	waiter := c.Slow(kR, 1)
	stepTo(t, "a request of the same key", waiter.Next(ms(1)), DoWait)

	answerLater(t, c, ms(2), ms(5))

	st := waiter.WaitFailed(ms(51))
	if d := st.Decision; st.Do != DoDecided || st.Err != nil || st.Degraded || d.Degraded || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > time.Second {
		t.Errorf("wait on an unanswered acquire, a later call answered: %+v; want denied with a retry of about a round trip, not degraded", st)
	}

	// The last answer came before the wait began, within a request
	// timeout of it: denied.
	recent := c.Slow(kR, 1)
	stepTo(t, "a request waiting after the last answer", recent.Next(ms(30)), DoWait)
	if st = recent.WaitFailed(ms(80)); st.Do != DoDecided || st.Degraded || st.Decision.Allowed || st.Decision.RetryAfter <= 0 {
		t.Errorf("wait begun 25ms after the region's last answer: %+v; want denied with a retry, not degraded", st)
	}

	// The last answer is older than a request timeout when the wait
	// begins (the region stopped answering): the policy decides.
	alone := c.Slow(kR, 1)
	stepTo(t, "a request waiting alone", alone.Next(ms(60)), DoWait)
	if st = alone.WaitFailed(ms(110)); st.Do != DoDecided || !st.Degraded || !st.Decision.Degraded {
		t.Errorf("wait on an unanswered acquire, none sent later answered: %+v; want decided by the policy", st)
	}
}

// TestCoreRoundsThatUsedUpTheWaitWhileTheRegionAnsweredAreDenied: a
// request whose rounds used up its wait (it waited on its key's report,
// and the tokens the region gave went to the key's other requests) is
// denied, to be asked again, when the region answered after it began:
// the region can decide, so the on_failure policy does not (an open class
// admitted every loser of a hot key's race for its refills). With no
// answer since it began, the policy decides.
func TestCoreRoundsThatUsedUpTheWaitWhileTheRegionAnsweredAreDenied(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	c, _, brk := newTestCore(t, 0, 50*time.Millisecond)
	fastAnswers(brk, rttSamples)

	sender := c.Slow(kR, 1)
	st := stepTo(t, "the acquire", sender.Next(ms(0)), DoAcquire)
	waiter := c.Slow(kR, 1)
	stepTo(t, "a request of the same key", waiter.Next(ms(1)), DoWait)
	// The region answers late in the waiter's wait, with one token, which
	// the sender takes.
	if st = sender.AcquireDone(ms(49), grantBatch(st.Batch, 1), Answered); st.Do != DoDecided || !st.Decision.Allowed {
		t.Fatalf("the sender, answered: %+v", st)
	}
	st = waiter.Next(ms(52))
	if d := st.Decision; st.Do != DoDecided || st.Degraded || d.Degraded || d.Allowed || d.RetryAfter <= 0 {
		t.Errorf("rounds that used up the wait while the region answered: %+v; want denied with a retry, not degraded", st)
	}

	// The same with no answer after the request began: the policy decides.
	sender = c.Slow(kW, 1)
	st = stepTo(t, "another acquire", sender.Next(ms(100)), DoAcquire)
	waiter = c.Slow(kW, 1)
	stepTo(t, "a request of its key", waiter.Next(ms(101)), DoWait)
	sender.AcquireDone(ms(149), nil, Unreachable)
	if st = waiter.Next(ms(152)); st.Do != DoDecided || !st.Degraded || !st.Decision.Degraded {
		t.Errorf("rounds that used up the wait with no answer since the request began: %+v; want decided by the policy", st)
	}
}
