package tiny

import "testing"

// The mutants v < lo -> v <= lo and v > hi -> v >= hi survive: they are
// equivalent (at v == lo, Clamp returns lo, which is v).
func TestClamp(t *testing.T) {
	for _, c := range []struct{ v, want int }{{-5, 0}, {5, 5}, {15, 10}} {
		if got := Clamp(c.v, 0, 10); got != c.want {
			t.Errorf("Clamp(%d, 0, 10) = %d, want %d", c.v, got, c.want)
		}
	}
}

func TestLabel(t *testing.T) {
	if got := Label(3); got != "n3" {
		t.Errorf("Label(3) = %q", got)
	}
	if got := Second([2]int{4, 5}); got != 5 {
		t.Errorf("Second = %d", got)
	}
}
