package tinylua

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// The mutant v < lo -> v <= lo survives: it is equivalent (at v == lo,
// both branches answer lo).
func TestClamp(t *testing.T) {
	c := redistest.Start(t).Client()
	for _, tc := range []struct{ v, want int64 }{{-5, 0}, {5, 5}, {15, 10}} {
		got, err := Clamp(context.Background(), c, tc.v, 0, 10)
		if err != nil {
			t.Fatalf("Clamp(%d, 0, 10): %v", tc.v, err)
		}
		if got != tc.want {
			t.Errorf("Clamp(%d, 0, 10) = %d, want %d", tc.v, got, tc.want)
		}
	}
}
