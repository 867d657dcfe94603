package oracle

import "time"

// window accumulates per-(key, region) tokens over consecutive windows of
// one size; only keys touched in a window are visited when it closes.
type window struct {
	size  time.Duration
	start time.Duration
	nr    int

	off, adm, den            []float64 // key*nr + region
	keyOff, keyAdm, keyIdeal []float64 // per key
	dirty                    []int
	isDirty                  []bool
}

// newWindow makes windows of size whose boundaries fall on from (and
// every size before and after it): the windows of the measures start
// where the warmup ends, not on multiples of size since the start.
func newWindow(size, from time.Duration, keys, nr int) *window {
	start := from % size
	if start > 0 {
		start -= size
	}
	return &window{
		size: size, nr: nr, start: start,
		off: make([]float64, keys*nr), adm: make([]float64, keys*nr), den: make([]float64, keys*nr),
		keyOff: make([]float64, keys), keyAdm: make([]float64, keys), keyIdeal: make([]float64, keys),
		isDirty: make([]bool, keys),
	}
}

func (w *window) add(k, r int, off, adm, den, ideal float64) {
	if !w.isDirty[k] {
		w.isDirty[k] = true
		w.dirty = append(w.dirty, k)
	}
	i := k*w.nr + r
	w.off[i] += off
	w.adm[i] += adm
	w.den[i] += den
	w.keyOff[k] += off
	w.keyAdm[k] += adm
	w.keyIdeal[k] += ideal
}

// closeUntil closes every window that ended at or before t, calling f
// with each window's start while its sums are still in place.
func (w *window) closeUntil(t time.Duration, f func(start time.Duration, w *window)) {
	for t >= w.start+w.size {
		f(w.start, w)
		for _, k := range w.dirty {
			w.isDirty[k] = false
			w.keyOff[k], w.keyAdm[k], w.keyIdeal[k] = 0, 0, 0
			base := k * w.nr
			for r := 0; r < w.nr; r++ {
				w.off[base+r], w.adm[base+r], w.den[base+r] = 0, 0, 0
			}
		}
		w.dirty = w.dirty[:0]
		w.start += w.size
	}
}
