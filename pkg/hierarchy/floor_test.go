package hierarchy

import (
	"math"
	"testing"
)

func TestFloor(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		rate, burst, share, unit float64
		wantRate, wantBurst      float64
	}{
		{"whole share keeps everything", 250, 7.5, 1, 3, 250, 7.5},
		{"zero share keeps nothing", 250, 500, 0, 1, 0, 0},
		{"zero share keeps nothing of an unbounded static share", math.Inf(1), math.Inf(1), 0, 1, 0, 0},
		{"burst rounds down to tokens", 100, 7, 0.5, 0, 50, 3},
		{"burst rounds down to units", 100, 20, 0.5, 4, 50, 8},
		{"less than one unit is none", 100, 5, 0.5, 4, 50, 0},
		{"share above one is clamped", 100, 10, 2, 1, 100, 10},
		{"negative share is zero", 100, 10, -1, 1, 0, 0},
		{"NaN share is zero", 100, 10, math.NaN(), 1, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, b := Floor(tc.rate, tc.burst, tc.share, tc.unit)
			if r != tc.wantRate || b != tc.wantBurst {
				t.Fatalf("Floor(%v, %v, %v, %v) = %v, %v; want %v, %v", tc.rate, tc.burst, tc.share, tc.unit, r, b, tc.wantRate, tc.wantBurst)
			}
		})
	}
}
