package lease

import (
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// deniedRetryAfter is the RetryAfter a request of cost tokens on key is
// told right after the region answered its acquire, sent and answered at
// at, with no tokens and a wait, as one of live instances on a key of
// rate 5/s and the given burst.
func deniedRetryAfter(t *testing.T, tb *Table, at time.Time, key quota.Key, cost int64, live int64, burst float64, wait time.Duration) time.Duration {
	t.Helper()
	acquire(t, tb, at, at, key, cost, 0, func(g *sluicev1.Grant) {
		g.RegionRate, g.RegionBurst, g.LiveInstances, g.Limit, g.RetryAfterMs = 5, burst, live, int64(burst), wait.Milliseconds()
	})
	d, act := allow(t, tb, at, key, cost)
	if act != ActNone || d.Allowed || d.RetryNever {
		t.Fatalf("a request of %d after the region's denial: %+v, action %v; want denied with a wait", cost, d, act)
	}
	return d.RetryAfter
}

// TestRetrySpreadIsOneRefillOfTheWholeNeed: peers denied a request of
// several tokens spread their next ask over one refill of all of them
// (600ms for 3 tokens at 5/s), not of one token, and over no more than
// the bucket's room beyond the need (200ms with a burst of 4).
func TestRetrySpreadIsOneRefillOfTheWholeNeed(t *testing.T) {
	const wait = time.Second
	for _, tc := range []struct {
		name   string
		burst  float64
		spread time.Duration
	}{
		{"room for several refills", 20, 600 * time.Millisecond}, // 3 tokens at 5/s
		{"room for a third of a refill", 4, 200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const draws = 64
			below := 0
			for i := range uint64(draws) {
				tb := newTestTable(t, func(o *TableOptions) { o.SeqBase = 1000*i + 7 })
				got := deniedRetryAfter(t, tb, t0, kW, 3, 2, tc.burst, wait)
				if got < wait || got >= wait+tc.spread {
					t.Fatalf("seq base %d: RetryAfter %v, want in [%v, %v)", 1000*i+7, got, wait, wait+tc.spread)
				}
				if got < wait+tc.spread/2 {
					below++
				}
			}
			if below < draws/4 || below > 3*draws/4 {
				t.Errorf("%d of %d draws in the first half of the spread; want them spread over it", below, draws)
			}
		})
	}
}

// TestRetrySpreadIsDrawnAnewEachRoundAndKey: one instance's spread is not
// the same at every denial: drawn from the instant too, the instance
// that asks first among peers changes from round to round (a spread fixed
// per instance would let the same one win every round); and keys denied
// at one instant draw apart.
func TestRetrySpreadIsDrawnAnewEachRoundAndKey(t *testing.T) {
	const wait = 200 * time.Millisecond
	distinct := func(what string, spreads []time.Duration) {
		t.Helper()
		seen := map[time.Duration]bool{}
		for _, s := range spreads {
			seen[s] = true
		}
		if len(seen) < len(spreads)/2 {
			t.Errorf("%s: %d distinct spreads of %d (%v); want them drawn apart", what, len(seen), len(spreads), spreads)
		}
	}
	var rounds []time.Duration
	tb := newTestTable(t, func(o *TableOptions) { o.SeqBase = 7 })
	for i := range 16 {
		// Each round after the last one's wait and spread (at most 400ms).
		at := t0.Add(time.Duration(i) * 437 * time.Millisecond)
		rounds = append(rounds, deniedRetryAfter(t, tb, at, kW, 1, 2, 5, wait)-wait)
	}
	distinct("one instance denied at 16 instants", rounds)

	var keys []time.Duration
	tb = newTestTable(t, func(o *TableOptions) { o.SeqBase = 7 })
	for i := range 16 {
		key := quota.Key{Tenant: "t" + string(rune('a'+i)), Class: "write"}
		keys = append(keys, deniedRetryAfter(t, tb, t0, key, 1, 2, 5, wait)-wait)
	}
	distinct("16 keys of one instance denied at one instant", keys)
}

// TestRetrySpreadUnderANanosecondIsNone: a bucket whose room beyond the
// need, or whose refill of the need, lasts less than a nanosecond gives
// no spread (and draws nothing from an empty range): the region's wait
// is told as it is.
func TestRetrySpreadUnderANanosecondIsNone(t *testing.T) {
	const wait = 200 * time.Millisecond
	tb := newTestTable(t, func(o *TableOptions) { o.SeqBase = 7 })
	if got := deniedRetryAfter(t, tb, t0, kW, 1, 2, 1+1e-12, wait); got != wait {
		t.Errorf("a room of 1e-12 tokens beyond the need: RetryAfter %v, want the region's %v", got, wait)
	}
}
