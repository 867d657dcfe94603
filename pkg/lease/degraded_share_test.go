package lease

import (
	"fmt"
	"strings"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// shareStep is one step of TestDegradedModeSharesTheLocalBoundWithTheRegionsAdmissions
// at t0+at: "lease n" spends n tokens from the key's lease (acquiring them
// first when the pool is empty), "spend n of m" spends n of m tokens
// granted, "check n" and "check-denied n" apply strict answers for n
// tokens, "degraded n" decides requests of one token with the on_failure
// policy until one is denied and expects n admitted; "learn" is an
// answer granting nothing, which tells the key the region's share.
type shareStep struct {
	at   time.Duration
	what string
}

// TestDegradedModeSharesTheLocalBoundWithTheRegionsAdmissions: the tokens
// a key admitted through the region (its lease, its strict answers) count
// against its local on_failure bucket too, so that the instance's
// admissions through the region and its degraded ones, together, stay
// within the local bound burst/live + rate/live·t over any window: a
// degraded decision right after the lease spent the bucket's worth finds
// it empty, not full. Tokens granted and not spent, and strict answers
// that denied, do not count; lease spending beyond the local bound (the
// region gave this instance more than its share) leaves the bucket in
// debt by at most one burst (docs/architecture.md, invariant 1's degraded
// mode), so degraded mode then admits at the local rate once the debt is
// refilled, never a burst on top of what the lease spent.
// The region here: 20/s, burst 20 over 4 live instances, so the local
// bucket is 5/s with burst 5.
func TestDegradedModeSharesTheLocalBoundWithTheRegionsAdmissions(t *testing.T) {
	const localRate, localBurst = 5, 5 // tokens/s, tokens
	kStrict := quota.Key{Tenant: "acme", Class: "strictlocal"}
	share := func(g *sluicev1.Grant) {
		g.RegionRate, g.RegionBurst, g.LiveInstances, g.Limit, g.RetryAfterMs = 20, 20, 4, 20, 0
	}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		name  string
		key   quota.Key
		steps []shareStep
		// bounded: every window's admissions are checked against the local
		// bound (the region-backed ones alone keep within it).
		bounded bool
	}{
		{name: "a burst through the lease, then degraded at once", key: kW, bounded: true, steps: []shareStep{
			{0, "lease 5"}, {0, "degraded 0"}, {ms(200), "degraded 1"},
		}},
		{name: "lease at the local rate after its burst, then degraded", key: kW, bounded: true, steps: []shareStep{
			{0, "lease 5"}, {ms(200), "lease 1"}, {ms(400), "lease 1"}, {ms(600), "lease 1"}, {ms(800), "lease 1"},
			{ms(1000), "lease 1"}, {ms(1000), "degraded 0"}, {ms(2000), "degraded 5"},
		}},
		{name: "degraded, the region answers and the lease spends, degraded again", key: kW, bounded: true, steps: []shareStep{
			{0, "learn"}, {0, "degraded 5"}, {ms(1000), "lease 5"}, {ms(1000), "degraded 0"}, {ms(1400), "degraded 2"},
		}},
		{name: "part of the bucket spent through the lease", key: kW, bounded: true, steps: []shareStep{
			{0, "lease 3"}, {0, "degraded 2"},
		}},
		{name: "a single token spent through the lease counts", key: kW, bounded: true, steps: []shareStep{
			{0, "lease 1"}, {0, "degraded 4"},
		}},
		{name: "a single token spent since the last degraded decision counts", key: kW, bounded: true, steps: []shareStep{
			{0, "lease 3"}, {0, "degraded 2"}, {ms(1000), "lease 1"}, {ms(1000), "degraded 4"},
		}},
		{name: "tokens granted but not spent do not count", key: kW, bounded: true, steps: []shareStep{
			{0, "spend 2 of 10"}, {0, "degraded 3"},
		}},
		{name: "the lease spends from an empty bucket: a debt the refill pays first", key: kW, steps: []shareStep{
			{0, "learn"}, {0, "degraded 5"}, {0, "lease 5"}, {0, "degraded 0"}, {ms(1000), "degraded 0"}, {ms(1400), "degraded 2"},
		}},
		{name: "lease beyond the local share leaves no debt", key: kW, steps: []shareStep{
			{0, "lease 50"}, {0, "degraded 0"}, {ms(1000), "degraded 5"},
		}},
		{name: "strict admissions count", key: kStrict, bounded: true, steps: []shareStep{
			{0, "check 4"}, {0, "degraded 1"}, {ms(600), "degraded 3"},
		}},
		{name: "a single strict admission counts", key: kStrict, bounded: true, steps: []shareStep{
			{0, "check 1"}, {0, "degraded 4"},
		}},
		{name: "strict denials do not count", key: kStrict, bounded: true, steps: []shareStep{
			{0, "check-denied 5"}, {0, "degraded 5"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTestTable(t, func(o *TableOptions) {
				o.Classes["strictlocal"] = ClassPolicy{Mode: ModeStrict, OnFailure: PolicyLocal}
			})
			type admission struct {
				at time.Duration
				n  int64
			}
			var admitted []admission
			lease := func(now time.Time, spend, grant int64) {
				if st, ok := tb.State(tc.key); !ok || st.Tokens == 0 {
					acquire(t, tb, now, now, tc.key, 1, grant, share)
				}
				for range spend {
					if d, act := allow(t, tb, now, tc.key, 1); !d.Allowed || d.Degraded || act == ActAcquire {
						t.Fatalf("lease spend at %v: %+v, %v", now.Sub(t0), d, act)
					}
				}
				admitted = append(admitted, admission{now.Sub(t0), spend})
			}
			// The region's rate and burst reach a strict key on its answers.
			rate, burst := 5.0, 5.0
			for _, s := range tc.steps {
				now := t0.Add(s.at)
				var n, m int64
				switch {
				case s.what == "learn":
					acquire(t, tb, now, now, tc.key, 1, 0, share)
				case strings.HasPrefix(s.what, "lease "):
					fmt.Sscanf(s.what, "lease %d", &n)
					lease(now, n, n)
				case strings.HasPrefix(s.what, "spend "):
					fmt.Sscanf(s.what, "spend %d of %d", &n, &m)
					lease(now, n, m)
				case strings.HasPrefix(s.what, "check"):
					fmt.Sscanf(s.what[strings.Index(s.what, " ")+1:], "%d", &n)
					allowed := !strings.HasPrefix(s.what, "check-denied")
					resp := &sluicev1.CheckResponse{Allowed: allowed, Limit: 20, RegionRate: &rate, RegionBurst: &burst}
					if _, err := tb.ApplyCheck(now, tc.key, n, resp); err != nil {
						t.Fatal(err)
					}
					if allowed {
						admitted = append(admitted, admission{s.at, n})
					}
				case strings.HasPrefix(s.what, "degraded "):
					fmt.Sscanf(s.what, "degraded %d", &n)
					var got int64
					for {
						d, err := tb.Fallback(now, tc.key, 1)
						if err != nil {
							t.Fatal(err)
						}
						if !d.Allowed {
							break
						}
						if got++; got > 1000 {
							t.Fatal("the local bucket admitted 1000 requests at one instant")
						}
					}
					if got != n {
						t.Fatalf("degraded at %v admitted %d, want %d (steps %v)", s.at, got, n, tc.steps)
					}
					admitted = append(admitted, admission{s.at, got})
				default:
					t.Fatalf("unknown step %q", s.what)
				}
			}
			if !tc.bounded {
				return
			}
			// Every window [admitted[i].at, admitted[j].at] holds at most
			// localBurst + localRate·t tokens, in whole milliseconds.
			for i := range admitted {
				var sum int64
				for j := i; j < len(admitted); j++ {
					sum += admitted[j].n
					span := (admitted[j].at - admitted[i].at).Milliseconds()
					if sum*1000 > localBurst*1000+localRate*span {
						t.Fatalf("admitted %d tokens in %dms, above the local bound %d + %d/s·t", sum, span, localBurst, localRate)
					}
				}
			}
		})
	}
}

// TestDegradedEpisodesCountEntriesIntoDegradedMode: an episode begins when
// the first key is decided by its on_failure policy and ends when the
// region has answered every degraded key; keys joining an episode under
// way do not start another.
func TestDegradedEpisodesCountEntriesIntoDegradedMode(t *testing.T) {
	tb := newTestTable(t)
	answer := func(key quota.Key) {
		t.Helper()
		if _, err := tb.ApplyCheck(t0, key, 1, &sluicev1.CheckResponse{Allowed: true, Limit: 5}); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range []struct {
		do       func()
		episodes uint64
	}{
		{func() { tb.Fallback(t0, kW, 1) }, 1},
		{func() { tb.Fallback(t0, kW, 1) }, 1},
		{func() { tb.Fallback(t0, kR, 1) }, 1},
		{func() { answer(kW) }, 1},
		// kR is still degraded: the episode goes on, though the region
		// answered a call since kR's last degraded decision.
		{func() { tb.Fallback(t0, kR, 1) }, 1},
		{func() { tb.Fallback(t0, kW, 1) }, 1},
		{func() { answer(kW) }, 1},
		{func() { answer(kR) }, 1},
		{func() { tb.Fallback(t0, kExp, 1) }, 2},
		{func() { answer(kExp) }, 2},
		{func() { tb.Fallback(t0, kR, 1) }, 3},
	} {
		s.do()
		if got := tb.DegradedEpisodes(); got != s.episodes {
			t.Fatalf("step %d: %d episodes, want %d", i, got, s.episodes)
		}
	}
}

// TestDegradedCostAboveTheLocalBurstRetriesWhenTheKeyAsksAgain: degraded,
// a cost within the key's burst (20) but above the local bucket's (5: the
// region's 20 over 4 live instances) is denied with a retry when the key
// next asks the region (a refresh), since no wait fills the local bucket
// past its burst; a cost within the local burst is denied with the time
// its tokens take at the local rate.
func TestDegradedCostAboveTheLocalBurstRetriesWhenTheKeyAsksAgain(t *testing.T) {
	tb := newTestTable(t)
	acquire(t, tb, t0, t0, kW, 1, 1, func(g *sluicev1.Grant) {
		g.RegionRate, g.RegionBurst, g.LiveInstances, g.Limit = 20, 20, 4, 20
	})
	for range 4 {
		if d, err := tb.Fallback(t0, kW, 1); err != nil || !d.Allowed {
			t.Fatalf("degraded, one token of a full local bucket of 5: %+v (%v)", d, err)
		}
	}
	for _, tc := range []struct {
		cost int64
		want time.Duration
	}{
		{6, tb.opts.Refresh},
		{20, tb.opts.Refresh},
		{3, 400 * time.Millisecond}, // 2 more tokens at 5/s
	} {
		d, err := tb.Fallback(t0, kW, tc.cost)
		if err != nil || d.Allowed || !d.Degraded || d.RetryNever || d.RetryAfter != tc.want || d.Cap != 5 {
			t.Errorf("degraded, cost %d on a local bucket of 5 holding 1: %+v (%v); want denied, retry after %v, cap 5", tc.cost, d, err, tc.want)
		}
	}
}
