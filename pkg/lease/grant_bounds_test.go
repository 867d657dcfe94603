package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestGrantOfOneMoreThanWantedIsRefused: a grant must lie within 0..want
// of the report it answers; one token more is a mismatch like any other:
// nothing is credited and the report stays pending, to be resent. A grant
// of exactly want is applied.
func TestGrantOfOneMoreThanWantedIsRefused(t *testing.T) {
	for _, extra := range []int64{1, 0} {
		tb := newTestTable(t)
		allow(t, tb, t0, kW, 1)
		b, _ := tb.PrepareAcquire(t0, kW, 1)
		r := b.Reports[0]
		err := tb.Apply(t0, b, []*sluicev1.Grant{regionGrant(r, r.Want+extra)})
		st := state(t, tb, kW)
		if extra > 0 {
			if err == nil || st.Tokens != 0 || st.Pending != r {
				t.Errorf("a grant of want+1 (%d): error %v, pool %d, pending %v; want refused, nothing credited, report pending", r.Want+1, err, st.Tokens, st.Pending)
			}
			continue
		}
		if err != nil || st.Tokens != r.Want || st.Pending != nil {
			t.Errorf("a grant of want (%d): error %v, pool %d, pending %v; want applied", r.Want, err, st.Tokens, st.Pending)
		}
	}
}

// TestNewLeaseTakesItsOwnDeadline: a later grant never shortens the
// deadline of the lease it renews (TestDeadlineTakesLatestSend), but a key
// whose lease ended (here: the table took a new identity, PrepareRebase)
// starts a new lease, whose deadline is its own grant's send time + TTL even
// when that falls before the old lease's: the region's record of the new
// lease ends then, and its tokens must not be spent after.
func TestNewLeaseTakesItsOwnDeadline(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 3)
	if st := state(t, tb, kW); !st.Deadline.Equal(t0.Add(testTTL)) {
		t.Fatalf("first lease's deadline %v, want %v", st.Deadline.Sub(t0), testTTL)
	}
	tb.PrepareRebase(t0.Add(time.Second))
	sent := t0.Add(time.Second)
	acquire(t, tb, sent, sent, kW, 1, 3, func(g *sluicev1.Grant) { g.TtlMs = 1000 })
	st := state(t, tb, kW)
	if !st.HasLease || !st.Deadline.Equal(sent.Add(time.Second)) {
		t.Fatalf("new lease: lease %v, deadline %v; want its own, %v", st.HasLease, st.Deadline.Sub(t0), sent.Add(time.Second).Sub(t0))
	}
	tb.Expire(sent.Add(time.Second))
	if st := state(t, tb, kW); st.HasLease || st.Tokens != 0 {
		t.Errorf("at the new lease's deadline: lease %v, pool %d; want ended, pool emptied", st.HasLease, st.Tokens)
	}
}
