package lease

import (
	"testing"
	"time"
)

// TestBreakerAnAnswerInNoTimeIsARoundTrip: an answer received at the
// instant its call was sent (a simulator's link of no delay, or a clock
// too coarse to tell) is an answer like any other: it says the region
// answers calls sent up to then, so an earlier call's failure does not
// count, and it is a round trip of zero that the median weighs. Only an
// answer "before" its call (a clock step back) is ignored.
func TestBreakerAnAnswerInNoTimeIsARoundTrip(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct {
		name        string
		sent, recv  time.Time
		earlierFail bool // a call sent at 0ms that failed counts
	}{
		{"answered in no time", ms(5), ms(5), false},
		{"answered a nanosecond later", ms(5), ms(5).Add(time.Nanosecond), false},
		{"answered before it was sent", ms(5), ms(5).Add(-time.Nanosecond), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBreaker(3, time.Second)
			b.ObserveRTT(tc.sent, tc.recv)
			if got := b.FailureOf(ms(0), ms(50)); got != tc.earlierFail {
				t.Fatalf("failure of a call sent before the answered one counted %v, want %v", got, tc.earlierFail)
			}
		})
	}
	// Three answers in no time and one of 100ms: the median is zero, so
	// the wait stays at its base.
	b := NewBreaker(3, time.Second)
	for i := range 3 {
		b.ObserveRTT(ms(i), ms(i))
	}
	b.ObserveRTT(ms(10), ms(110))
	if got := b.Timeout(50*time.Millisecond, time.Second); got != 50*time.Millisecond {
		t.Fatalf("timeout after round trips 0, 0, 0, 100ms: %v, want the base 50ms", got)
	}
}
