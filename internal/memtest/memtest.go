// Package memtest measures the live heap for the tests that check memory
// follows live keys (docs/architecture.md, invariant 7).
package memtest

import "runtime"

// HeapAlloc returns the bytes of live heap objects after two garbage
// collections: the second one frees what finalizers of the first kept
// alive, so two readings around a workload compare what it still holds.
func HeapAlloc() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
