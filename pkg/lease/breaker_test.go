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
