package allocator

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/memtest"
)

// memoryConfig has a horizon (two validities and two epochs) far longer
// than the reports take to send.
const memoryConfig = `
epoch: 10s
grant_validity: 60s
regions:
  a: {weight: 1}
  b: {weight: 1}
classes:
  write: {}
tiers:
  free: {write: {rate: 100/s, burst: 100}}
default_tier: free
`

// TestIdleKeysForgotten: a region reports 200,000 distinct keys once, in
// pages of DefaultMaxKeysPerPage; two grant validities and two epochs
// later (now advanced) the leader has forgotten them all, and the memory
// they and the pages took is back. It logs the heap per key held.
func TestIdleKeysForgotten(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	s := quietService(t, &memConfig{cfg: parseConfig(t, memoryConfig)})
	if !s.promote(1, time.Now().Add(time.Hour), nil) {
		t.Fatal("promote refused")
	}
	base := memtest.HeapAlloc()
	rep := &sluicev1.RegionReport{Region: "a", Seq: 1}
	for i := range n {
		rep.Keys = append(rep.Keys, &sluicev1.KeyDemand{
			Key: &sluicev1.QuotaKey{Tenant: fmt.Sprintf("t%07d", i), Class: "write"}, Admitted: 1, WindowMs: 100,
		})
	}
	// The pages are heard between first and last on the service's clock:
	// a starved -race run takes seconds over 200,000 keys, so "before the
	// horizon" counts from the first page and "after" from the last.
	first := time.Now()
	for _, p := range splitReport(rep, DefaultMaxKeysPerPage) {
		if _, err := s.SyncPage(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	rep = nil
	if got := s.trackedKeys(); got != n {
		t.Fatalf("tracking %d keys after the reports, want %d", got, n)
	}
	t.Logf("heap %.0f B per key held", float64(memtest.HeapAlloc()-base)/float64(n))
	last := time.Now()
	horizon := 2*s.timing.validity + 2*s.timing.epoch
	s.step(first.Add(horizon / 2))
	if got := s.trackedKeys(); got != n {
		t.Fatalf("tracking %d keys before the horizon, want all %d", got, n)
	}
	s.step(last.Add(horizon + time.Millisecond))
	if got, v := s.trackedKeys(), s.View(last.Add(horizon)); got != 0 || len(v.Keys) != 0 {
		t.Fatalf("after the horizon: tracking %d keys, allocator viewing %d; want none", got, len(v.Keys))
	}
	left := memtest.HeapAlloc() - base
	t.Logf("heap %+.1f MiB from the baseline", float64(left)/(1<<20))
	if left > 4<<20 {
		t.Fatalf("heap %.1f MiB above the baseline after every key was forgotten", float64(left)/(1<<20))
	}
	runtime.KeepAlive(s)
}
