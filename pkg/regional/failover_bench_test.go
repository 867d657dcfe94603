package regional_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// BenchmarkFirstDecisionsAfterRedisStop measures how long the first
// decisions take once the region's Redis stops answering (SIGSTOP): each
// iteration stops Redis, has 4 instances decide 4 requests each on keys
// they hold nothing for (each must ask the region, which cannot answer),
// then continues Redis and waits until every instance is served again and
// has seen a few ordinary answers.
// It reports the latency distribution of those first decisions (ms) and
// how many were not degraded (answered by the region: none should be).
// SLUICE_BENCH_LOAD=n runs n busy goroutines beside it (other work on the
// same cores). Run with -benchtime=Nx (one fault per iteration):
//
//	go test -run '^$' -bench FirstDecisionsAfterRedisStop -benchtime 20x ./pkg/regional/
func BenchmarkFirstDecisionsAfterRedisStop(b *testing.B) {
	const instances, perInstance = 4, 4
	rs, clients := benchRegion(b, instances, 200*time.Millisecond)
	next := 0
	key := func() quota.Key { next++; return quota.Key{Tenant: fmt.Sprintf("t%d", next), Class: "read"} }
	served := func() {
		deadline := time.Now().Add(30 * time.Second)
		for _, c := range clients {
			for {
				dec, err := c.Allow(context.Background(), key(), 1)
				if err != nil {
					b.Fatal(err)
				}
				if !dec.Degraded {
					break
				}
				if time.Now().After(deadline) {
					b.Fatal("instances not served again within 30s of Redis continuing")
				}
				time.Sleep(10 * time.Millisecond) // polling the recovery with a deadline
			}
			// The fault hits a region that answers as usual: a few
			// answers after the recovery's backlog (the instance's wait
			// follows the median of its last 16).
			for range 9 {
				if _, err := c.Allow(context.Background(), key(), 1); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	served()
	var lat []time.Duration
	answered := 0
	var mu sync.Mutex
	b.ResetTimer()
	for range b.N {
		rs.Pause()
		var wg sync.WaitGroup
		for _, c := range clients {
			keys := make([]quota.Key, perInstance)
			for j := range keys {
				keys[j] = key()
			}
			for _, k := range keys {
				wg.Add(1)
				go func() {
					defer wg.Done()
					dec, took, ok := timedAllow(b, c, k)
					if !ok {
						return
					}
					mu.Lock()
					lat = append(lat, took)
					if !dec.Degraded {
						answered++
					}
					mu.Unlock()
				}()
			}
		}
		wg.Wait()
		rs.Resume()
		served()
	}
	b.StopTimer()
	reportLatencies(b, lat)
	b.ReportMetric(float64(answered), "not-degraded")
}

// benchRegion starts a regional daemon on a real redis-server (no global
// tier) and n instances of it (refresh as given, the default breaker), and,
// with SLUICE_BENCH_LOAD=k, k busy goroutines beside them (other work on
// the same cores), all stopped at b's cleanup.
func benchRegion(b *testing.B, n int, refresh time.Duration) (*redistest.Server, []*lease.Client) {
	rs := redistest.Start(b)
	cfg := regiontest.MustConfig(b, sharedKeyConfig)
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: rs.Addr(),
		Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull, Unleased: true,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(d.Stop)
	reg := &regiontest.Region{Addr: d.GRPCAddr()}
	clients := make([]*lease.Client, n)
	for i := range clients {
		c, err := lease.NewClient(reg.Dial(b), lease.Options{InstanceID: fmt.Sprintf("i-%d", i), Refresh: refresh})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close(context.Background()) })
		clients[i] = c
	}
	if k, _ := strconv.Atoi(os.Getenv("SLUICE_BENCH_LOAD")); k > 0 {
		stop := make(chan struct{})
		b.Cleanup(func() { close(stop) })
		for range k {
			go func() {
				for {
					select {
					case <-stop:
						return
					default:
						runtime.Gosched()
					}
				}
			}()
		}
	}
	return rs, clients
}

// BenchmarkFirstTouchDecisionsWhileRedisIsHealthy is the other side of
// the breaker: with Redis healthy, first decisions on keys an instance
// holds nothing for (each must ask the region) must be answered by the
// region, however loaded the machine, not decided by on_failure as if the
// region were down. Each iteration has 4 instances decide 25 fresh keys
// each at once; it reports how many of the decisions were degraded (none
// should be), how many denied (a call that waited out its time while the
// region answered others: denied, to be asked again), and their latency
// (ms). Run beside other work to see a loaded machine (SLUICE_BENCH_LOAD,
// or other processes):
//
//	go test -run '^$' -bench FirstTouchDecisionsWhileRedisIsHealthy -benchtime 1000x ./pkg/regional/
func BenchmarkFirstTouchDecisionsWhileRedisIsHealthy(b *testing.B) {
	const instances = 4
	perInstance := 25
	if n, _ := strconv.Atoi(os.Getenv("SLUICE_BENCH_CONCURRENCY")); n > 0 {
		perInstance = n
	}
	// The default refresh: a background Sync's timeout, half of it,
	// bounds the wait (Core.RequestTimeout).
	_, clients := benchRegion(b, instances, time.Second)
	var next atomic.Int64
	key := func() quota.Key { return quota.Key{Tenant: fmt.Sprintf("t%d", next.Add(1)), Class: "read"} }
	var lat []time.Duration
	degraded, denied := 0, 0
	var mu sync.Mutex
	b.ResetTimer()
	for range b.N {
		var wg sync.WaitGroup
		for _, c := range clients {
			for range perInstance {
				k := key()
				wg.Go(func() {
					dec, took, ok := timedAllow(b, c, k)
					if !ok {
						return
					}
					mu.Lock()
					lat = append(lat, took)
					switch {
					case dec.Degraded:
						degraded++
					case !dec.Allowed:
						// The key's limit is far above one request: a
						// denial is a call that waited out its time behind
						// the burst (Breaker.FailureOf).
						denied++
					}
					mu.Unlock()
				})
			}
		}
		wg.Wait()
	}
	b.StopTimer()
	reportLatencies(b, lat)
	b.ReportMetric(float64(degraded), "degraded")
	b.ReportMetric(float64(denied), "denied")
	b.ReportMetric(float64(len(lat)), "decisions")
}

// timedAllow decides one request on k and says how long it took; ok false
// after reporting the error.
func timedAllow(b *testing.B, c *lease.Client, k quota.Key) (dec quota.Decision, took time.Duration, ok bool) {
	start := time.Now()
	dec, err := c.Allow(context.Background(), k, 1)
	took = time.Since(start)
	if err != nil {
		b.Error(err)
		return dec, took, false
	}
	return dec, took, true
}

// reportLatencies reports lat's p50, p90, p99 and max in ms.
func reportLatencies(b *testing.B, lat []time.Duration) {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.9), "p90-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
}
