// Package rapidfuzz turns a property test written with pgregory.net/rapid
// into a Go fuzz target, so that `make fuzz` searches the same property the
// ordinary test samples.
//
// rapid reads a fuzz input as a stream of little-endian uint64 choices;
// an input that runs out before the property has drawn all it needs is
// skipped, not failed. Seeds therefore have to be long: [AddSeeds] adds
// deterministic pseudo-random inputs of a given length, the same on every
// machine and run, so a seed that fails once fails again.
package rapidfuzz

import (
	"math/rand/v2"
	"testing"

	"pgregory.net/rapid"
)

// AddSeeds adds n seed inputs of size bytes each to f, drawn from a
// PCG generator seeded with 1, 2, … n.
func AddSeeds(f *testing.F, n, size int) {
	f.Helper()
	for i := range n {
		src := rand.New(rand.NewPCG(uint64(i+1), 0x5ced))
		in := make([]byte, size)
		for j := range in {
			in[j] = byte(src.Uint32())
		}
		f.Add(in)
	}
}

// Target is rapid.MakeFuzz for a property that needs the fuzz call's own
// *testing.T (to build fixtures that register cleanups on it).
func Target(prop func(t *testing.T) func(*rapid.T)) func(*testing.T, []byte) {
	return func(t *testing.T, in []byte) {
		t.Helper()
		rapid.MakeFuzz(prop(t))(t, in)
	}
}
