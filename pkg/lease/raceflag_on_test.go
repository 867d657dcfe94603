//go:build race

package lease

// raceDetector: this test binary runs under -race (as make test does),
// slow enough between a load and its compare-and-swap that races are
// certainly lost in the concurrency tests.
const raceDetector = true
