// Package shrink gives a map's memory back once most of its entries are
// gone. Go maps never shrink when entries are deleted: a map that once held
// a million keys keeps their room after they are all deleted. Structures
// keyed by quota key note their high-water mark and swap in a right-sized
// copy when the live entries fall below a quarter of it, which costs O(1)
// amortized per deletion.
package shrink

// MinPeak is the high-water mark below which a map is never copied: small
// maps are not worth the work.
const MinPeak = 1024

// Peak is one map's high-water mark since it was last compacted. The zero
// value is ready to use. Not safe for concurrent use: guard it with the
// map's lock.
type Peak struct{ n int }

// Note records the map's current size; call it after inserting.
func (p *Peak) Note(size int) {
	if size > p.n {
		p.n = size
	}
}

// Due reports whether a map of size entries should be replaced by a copy.
func (p *Peak) Due(size int) bool { return p.n >= MinPeak && size < p.n/4 }

// Reset starts a new high-water mark at size (after the map was copied).
func (p *Peak) Reset(size int) { p.n = size }

// Map returns m, or a right-sized copy of it when it holds less than a
// quarter of its high-water mark.
func Map[K comparable, V any](m map[K]V, p *Peak) map[K]V {
	if !p.Due(len(m)) {
		return m
	}
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	p.Reset(len(c))
	return c
}
