//go:build race

package envoyrls

// raceDetector: this test binary runs under -race (as make test does).
// sync.Pool then drops a quarter of what is put back, at random, so a
// pooled buffer is sometimes allocated anew.
const raceDetector = true
