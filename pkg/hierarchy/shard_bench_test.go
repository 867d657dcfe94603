package hierarchy

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/envcount"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/shard"
)

// BenchmarkShardedAllocateEpoch is the sharded global tier's epoch: the
// contended keys (SLUICE_SHARD_BENCH_KEYS, default 40,000; BENCHMARKS.md
// runs 1,000,000) × 5 regions split over 4 shards by the shard map, each
// shard's allocator alone (one core each in a deployment, one after
// another here), then one unsharded allocator over a quarter of the keys,
// in the same run. One epoch = Allocate plus one Report per region, as in
// BenchmarkAllocateEpoch. It reports each shard's and the single
// allocator's ms/epoch and the slowest shard over the single one.
func BenchmarkShardedAllocateEpoch(b *testing.B) {
	total := envcount.Get(b, "SLUICE_SHARD_BENCH_KEYS", 40_000, 4)
	const shards = 4
	m, err := shard.New(shards)
	if err != nil {
		b.Fatal(err)
	}
	parts := make([][]quota.Key, shards)
	for k := range total {
		key := quota.Key{Tenant: fmt.Sprintf("tenant-%07d", k), Class: "write"}
		parts[m.Of(key)] = append(parts[m.Of(key)], key)
	}
	single := make([]quota.Key, total/shards)
	for k := range single {
		single[k] = quota.Key{Tenant: fmt.Sprintf("tenant-%07d", k), Class: "write"}
	}
	// Each world alone: build, warm up past learning, time b.N epochs,
	// drop it before the next is built.
	measure := func(keys []quota.Key) time.Duration {
		w := newBenchWorldOf(b, keys)
		noop := func(bool) {}
		for range 8 {
			w.epoch(b, noop)
		}
		var spent time.Duration
		var from time.Time
		timed := func(on bool) {
			if on {
				from = time.Now()
			} else {
				spent += time.Since(from)
			}
		}
		for range b.N {
			w.epoch(b, timed)
		}
		runtime.GC()
		return spent / time.Duration(b.N)
	}
	b.ResetTimer()
	var slowest time.Duration
	for i, keys := range parts {
		d := measure(keys)
		slowest = max(slowest, d)
		b.ReportMetric(float64(d.Microseconds())/1000, fmt.Sprintf("shard%d-ms/epoch", i))
		b.ReportMetric(float64(len(keys)), fmt.Sprintf("shard%d-keys", i))
	}
	one := measure(single)
	b.ReportMetric(float64(one.Microseconds())/1000, "single-ms/epoch")
	b.ReportMetric(float64(slowest)/float64(one), "slowest-shard/single")
}
