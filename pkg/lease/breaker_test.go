package lease

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	b := NewBreaker(3, time.Second)
	now := t0
	for i := 0; i < 2; i++ {
		b.Failure(now)
		if !b.Allow(now) || b.Open() {
			t.Fatalf("open after %d failures, threshold 3", i+1)
		}
	}
	b.Success()
	b.Failure(now)
	b.Failure(now)
	if b.Open() {
		t.Fatal("success did not reset the consecutive count")
	}
	b.Failure(now)
	if !b.Open() || b.Allow(now) || b.Ready(now.Add(999*time.Millisecond)) {
		t.Fatal("not open after 3 consecutive failures")
	}

	// Half-open: one probe at a time.
	probeAt := now.Add(time.Second)
	if !b.Ready(probeAt) || !b.Allow(probeAt) {
		t.Fatal("no probe after the cooldown")
	}
	if b.Ready(probeAt) || b.Allow(probeAt) {
		t.Fatal("second probe while one is in flight")
	}
	b.Failure(probeAt)
	if b.Allow(probeAt.Add(999*time.Millisecond)) || !b.Allow(probeAt.Add(time.Second)) {
		t.Fatal("failed probe did not reopen for one cooldown")
	}
	b.Abandon()
	if !b.Allow(probeAt.Add(time.Second)) {
		t.Fatal("abandoned probe kept its slot")
	}
	b.Success()
	if b.Open() || !b.Allow(probeAt) {
		t.Fatal("successful probe did not close the breaker")
	}
}

// TestBreakerTimeoutFollowsSlowAnswers: the wait before a failure is the
// breaker timeout while the region answers fast, follows the region's
// recent round trips (4 × their median) when they are slow, never beyond
// the limit, and is lengthened neither by calls that got no answer nor by
// a few answers delayed by an outage.
func TestBreakerTimeoutFollowsSlowAnswers(t *testing.T) {
	const base, limit = 50 * time.Millisecond, 500 * time.Millisecond
	b := NewBreaker(3, time.Second)
	if got := b.Timeout(base, limit); got != base {
		t.Fatalf("no answer seen yet: timeout %v, want %v", got, base)
	}
	at := t0
	rtt := func(d time.Duration) {
		b.ObserveRTT(at, at.Add(d))
		at = at.Add(time.Second)
	}
	for range 20 {
		rtt(time.Millisecond)
	}
	if got := b.Timeout(base, limit); got != base {
		t.Fatalf("fast answers: timeout %v, want %v", got, base)
	}
	b.Failure(t0)
	b.Failure(t0)
	if got := b.Timeout(base, limit); got != base {
		t.Fatalf("failures changed the timeout to %v", got)
	}
	// A few answers that waited out an outage do not lengthen the wait.
	for range 3 {
		rtt(2 * time.Second)
	}
	if got := b.Timeout(base, limit); got != base {
		t.Fatalf("three answers delayed by an outage changed the timeout to %v", got)
	}
	for range 20 {
		rtt(120 * time.Millisecond)
	}
	if got := b.Timeout(base, limit); got <= 120*time.Millisecond || got > limit {
		t.Fatalf("answers in 120ms: timeout %v, want above 120ms and at most %v", got, limit)
	}
	for range 20 {
		rtt(10 * time.Second)
	}
	if got := b.Timeout(base, limit); got != limit {
		t.Fatalf("answers in 10s: timeout %v, want the limit %v", got, limit)
	}
	// A configured timeout above the limit is kept as it is.
	if got := NewBreaker(3, time.Second).Timeout(time.Second, limit); got != time.Second {
		t.Fatalf("base above the limit: %v", got)
	}
}
