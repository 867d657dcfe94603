package regional

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/envcount"
)

// BenchmarkActiveTouchDuringScrape is what a lease reply waits to record
// its key (activeKeys.touch) while the live-lease gauge is scraped over
// and over (activeKeys.leases walks every key) in another goroutine, with
// SLUICE_ACTIVE_BENCH_KEYS keys held (default 1,000,000). It reports the
// median, 99th percentile and longest touch, and how many scrapes ran.
func BenchmarkActiveTouchDuringScrape(b *testing.B) {
	n := envcount.Get(b, "SLUICE_ACTIVE_BENCH_KEYS", 1_000_000, 1)
	keys := manyKeys(n)
	a := newActiveKeys()
	now := time.Unix(1000, 0)
	for _, k := range keys {
		a.touch(now, k, 1)
	}
	var stop atomic.Bool
	var scrapes atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			a.leases(now, time.Hour)
			scrapes.Add(1)
		}
	}()
	waits := make([]time.Duration, b.N)
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		a.touch(now, keys[(i*7919)%n], 1)
		waits[i] = time.Since(start)
	}
	b.StopTimer()
	stop.Store(true)
	<-done
	slices.Sort(waits)
	b.ReportMetric(float64(waits[len(waits)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(waits[len(waits)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(waits[len(waits)-1].Nanoseconds()), "max-ns")
	b.ReportMetric(float64(scrapes.Load()), "scrapes")
}
