package shrink

import (
	"runtime"
	"testing"
)

func heapAlloc() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestMapGivesMemoryBack: a map emptied by deletions keeps its room until
// Map copies it.
func TestMapGivesMemoryBack(t *testing.T) {
	const n = 200_000
	base := heapAlloc()
	var p Peak
	m := map[int64][4]int64{}
	for i := range int64(n) {
		m[i] = [4]int64{i}
		p.Note(len(m))
	}
	full := heapAlloc()
	for i := range int64(n - 10) {
		delete(m, i)
	}
	m = Map(m, &p)
	after := heapAlloc()
	if len(m) != 10 {
		t.Fatalf("len %d after compaction, want 10", len(m))
	}
	grown := full - base
	if left := int64(after) - int64(base); left > int64(grown/10) {
		t.Fatalf("%d bytes left of %d after deleting all but 10 entries", left, grown)
	}
	if p.Due(len(m)) {
		t.Fatal("compaction due again right after compacting")
	}
	runtime.KeepAlive(m)
}

func TestSmallMapsAreLeftAlone(t *testing.T) {
	var p Peak
	m := map[int]int{}
	for i := range MinPeak - 1 {
		m[i] = i
		p.Note(len(m))
	}
	clear(m)
	if p.Due(0) {
		t.Fatal("a map that never reached MinPeak was due for compaction")
	}
}
