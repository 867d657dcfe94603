package regional_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
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
	const instances, perInstance = 4, 4
	clients := make([]*lease.Client, instances)
	for i := range clients {
		c, err := lease.NewClient(reg.Dial(b), lease.Options{InstanceID: fmt.Sprintf("i-%d", i), Refresh: 200 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close(context.Background()) })
		clients[i] = c
	}
	if n, _ := strconv.Atoi(os.Getenv("SLUICE_BENCH_LOAD")); n > 0 {
		stop := make(chan struct{})
		b.Cleanup(func() { close(stop) })
		for range n {
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
					start := time.Now()
					dec, err := c.Allow(context.Background(), k, 1)
					took := time.Since(start)
					if err != nil {
						b.Error(err)
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
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.9), "p90-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(float64(answered), "not-degraded")
}
