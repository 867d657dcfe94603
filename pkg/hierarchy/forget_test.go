package hierarchy

import (
	"testing"
	"time"
)

func TestForgettable(t *testing.T) {
	epoch, validity := time.Second, 5*time.Second
	t0 := time.Unix(1_700_000_000, 0)
	h := ForgetHorizon(epoch, validity)
	if h != 12*time.Second {
		t.Fatalf("horizon %v, want 2·validity + 2·epoch = 12s", h)
	}
	for _, tc := range []struct {
		name  string
		idle  time.Duration
		floor time.Time
		want  bool
	}{
		{"named within the horizon", h, time.Time{}, false},
		{"idle past the horizon", h + time.Nanosecond, time.Time{}, true},
		{"idle, but before the learning floor", h + time.Hour, t0.Add(h + time.Hour + 1), false},
		{"idle, at the learning floor", h + time.Hour, t0.Add(h + time.Hour), true},
	} {
		now := t0.Add(tc.idle)
		if got := Forgettable(now, t0, tc.floor, epoch, validity); got != tc.want {
			t.Errorf("%s: Forgettable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
