package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestCoreKeyFailedHoldsOffOnlyItsKey: a call the region answers with its
// key's Redis Cluster node failing it (KeyFailed) decides the request by
// the key's on_failure policy and holds that key off: its requests are
// decided by the policy without a call until the breaker's cooldown has
// passed, then call again. The region answered, so the breaker stays
// closed however many such answers come, and other keys call as usual.
// Both request paths: the lease's acquire and the strict check.
func TestCoreKeyFailedHoldsOffOnlyItsKey(t *testing.T) {
	for _, key := range []quota.Key{kW, kExp} {
		c, tb, brk := newTestCore(t, 0, 50*time.Millisecond)
		want := DoAcquire
		if key == kExp {
			want = DoCheck
		}
		now := t0
		for i := range DefaultBreakerFailures + 1 {
			k := quota.Key{Tenant: key.Tenant + string(rune('a'+i)), Class: key.Class}
			s := c.Slow(k, 1)
			stepTo(t, k.String()+" first request", s.Next(now), want)
			var st Step
			if want == DoAcquire {
				st = s.AcquireDone(now.Add(time.Millisecond), nil, KeyFailed)
			} else {
				st = s.CheckDone(now.Add(time.Millisecond), nil, KeyFailed)
			}
			if st.Do != DoDecided || !st.Degraded {
				t.Fatalf("%s answered KeyFailed: %+v, want decided by its policy", k, st)
			}
			if ks := state(t, tb, k); ks.InFlight {
				t.Fatalf("%s still in flight after its answer", k)
			}
			now = now.Add(2 * time.Millisecond)
		}
		if brk.Open() {
			t.Fatalf("%s: the breaker opened on %d answers that a key's node failed", key, DefaultBreakerFailures+1)
		}
		held := quota.Key{Tenant: key.Tenant + "a", Class: key.Class}
		// Within the cooldown: decided by the policy, no call.
		next := func(k quota.Key, at time.Time) Step { s := c.Slow(k, 1); return s.Next(at) }
		st := next(held, t0.Add(DefaultBreakerCooldown-time.Millisecond))
		if st.Do != DoDecided || !st.Degraded || st.Batch != nil {
			t.Fatalf("%s within the cooldown of its node's failure: %+v, want decided by its policy without a call", held, st)
		}
		// Another key calls as usual.
		stepTo(t, key.String()+" of another node", next(quota.Key{Tenant: "other", Class: key.Class}, now), want)
		// After the cooldown the held key calls again.
		stepTo(t, held.String()+" after the cooldown", next(held, t0.Add(DefaultBreakerCooldown+2*time.Millisecond)), want)
	}
}

// TestCoreSyncAnsweredPerKey: a Sync answered with one key's grant marked
// redis_failed (its Redis Cluster node failed it) applies the other keys'
// grants; the failed key is not applied (no lease from the empty grant,
// its report still pending to be sent again, not in flight) and is held
// off for the breaker's cooldown, and the breaker stays closed.
func TestCoreSyncAnsweredPerKey(t *testing.T) {
	c, tb, brk := newTestCore(t, 0, 50*time.Millisecond)
	acquire(t, tb, t0, t0, kW, 1, 1)
	acquire(t, tb, t0, t0, kR, 1, 1)
	before, beforeR := state(t, tb, kW), state(t, tb, kR)
	at := t0.Add(500 * time.Millisecond)
	round := c.PrepareSync(at)
	b, _ := round.Next()
	if b == nil || len(b.Reports) != 2 {
		t.Fatalf("the round's batch: %+v, want both keys' reports", b)
	}
	grants := grantBatch(b, 0) // the pools are full: a renewal
	failed := -1
	for i, r := range b.Reports {
		if r.GetKey().GetClass() == kW.Class {
			grants[i] = &sluicev1.Grant{Key: r.Key, Seq: r.Seq, RedisFailed: true}
			failed = i
		}
	}
	if _, _, err := round.Sent(at.Add(time.Millisecond), b, grants, Answered); err != nil {
		t.Fatalf("a Sync answered per key: %v", err)
	}
	if brk.Open() {
		t.Fatal("the breaker opened on a Sync the region answered")
	}
	if ks := state(t, tb, kR); ks.InFlight || ks.Pending != nil || !ks.Deadline.After(beforeR.Deadline) {
		t.Fatalf("%s, answered: %+v, want its grant applied (its lease renewed past %v)", kR, ks, beforeR.Deadline)
	}
	ks := state(t, tb, kW)
	if ks.InFlight || ks.Pending == nil || ks.Pending.Seq != b.Reports[failed].Seq {
		t.Fatalf("%s, its node failed: %+v, want its report pending and not in flight", kW, ks)
	}
	if ks.Deadline != before.Deadline || ks.Tokens > before.Tokens {
		t.Fatalf("%s, its node failed: deadline %v tokens %d, want its lease as before (%v, %d): the empty grant was applied",
			kW, ks.Deadline, ks.Tokens, before.Deadline, before.Tokens)
	}
	if !tb.HeldOff(at.Add(DefaultBreakerCooldown), kW) || tb.HeldOff(at.Add(DefaultBreakerCooldown+2*time.Millisecond), kW) {
		t.Fatalf("%s: held off for the breaker's cooldown %v after its node failed, want exactly that", kW, DefaultBreakerCooldown)
	}
	if tb.HeldOff(at, kR) {
		t.Fatalf("%s held off although answered", kR)
	}
	// A Release answered that a key's node failed is an answer of the
	// region too; one that got none is not.
	sent := at.Add(2 * time.Second)
	c.ReleaseDone(sent, sent.Add(time.Millisecond), KeyFailed)
	if !brk.AnsweredSince(sent.Add(-time.Nanosecond)) || brk.Open() {
		t.Fatal("a Release answered that its key's node failed: not taken as the region's answer")
	}
	unanswered := sent.Add(time.Second)
	c.ReleaseDone(unanswered, unanswered.Add(time.Millisecond), Unreachable)
	if brk.AnsweredSince(unanswered.Add(-time.Nanosecond)) {
		t.Fatal("a Release that got no answer taken as an answer")
	}
}
