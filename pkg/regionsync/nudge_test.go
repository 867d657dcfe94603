package regionsync

import (
	"testing"
	"time"
)

func TestNudgedRoundAcknowledgesAndCatchesUp(t *testing.T) {
	r := NewNudgedRound(time.Second)
	if k, wait, more := r.Next(Answer{Lowered: true}); !more || k != Ack || wait != 0 {
		t.Fatalf("a nudged report whose answer lowered a grant: next %v after %v (more %v), want an ack at once", k, wait, more)
	}
	if k, wait, more := r.Next(Answer{Lowered: true, Again: 300 * time.Millisecond}); !more || k != CatchUp || wait != 300*time.Millisecond {
		t.Fatalf("after the ack: next %v after %v (more %v), want a catch-up after 300ms", k, wait, more)
	}
	if _, _, more := NewNudgedRound(time.Second).Next(Answer{}); more {
		t.Fatal("a nudged report with nothing lowered or pending ends its round")
	}
	if Nudged.String() != "nudged" {
		t.Fatalf("label %q", Nudged.String())
	}
}

func TestNudgeWaitKeepsTheSpacing(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	epoch := time.Second
	for _, tc := range []struct {
		since, want time.Duration
	}{
		{0, 125 * time.Millisecond},
		{100 * time.Millisecond, 25 * time.Millisecond},
		{125 * time.Millisecond, 0},
		{time.Hour, 0},
	} {
		if got := NudgeWait(start, start.Add(tc.since), epoch); got != tc.want {
			t.Errorf("nudge %v after the last round started: wait %v, want %v", tc.since, got, tc.want)
		}
	}
}
