package lease

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// heldTable returns a table holding n keys, each with a lease far from its
// deadline and tokens for far more requests than a benchmark makes, and
// copies of their keys (not sharing the table's strings, as a caller's keys
// do not).
func heldTable(b *testing.B, n int) (*Table, []quota.Key) {
	b.Helper()
	tb, err := NewTable(TableOptions{Refresh: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	// A reading with the monotonic clock, as the Client's zero is, so the
	// hot path's time.Since below costs what it costs the Client.
	now := time.Now()
	keys := make([]quota.Key, n)
	for i := range keys {
		k := quota.Key{Tenant: fmt.Sprintf("t%07d", i), Class: "write"}
		if _, act, err := tb.Allow(now, k, 1); err != nil || act != ActAcquire {
			b.Fatalf("first request on %s: %v %v", k, act, err)
		}
		bt, _ := tb.PrepareAcquire(now, k, quota.MaxWant)
		if bt == nil {
			b.Fatalf("no acquire for %s", k)
		}
		r := bt.Reports[0]
		g := &sluicev1.Grant{
			Key: r.Key, Seq: r.Seq, Granted: r.Want, TtlMs: time.Hour.Milliseconds(),
			RegionRate: 1e9, RegionBurst: 1 << 31, LiveInstances: 1, Limit: 1 << 40,
			Mode: "lease", OnFailure: "local", Tier: "pro", ResetMs: 100,
		}
		if err := tb.Apply(now, bt, []*sluicev1.Grant{g}); err != nil {
			b.Fatal(err)
		}
		keys[i] = quota.Key{Tenant: fmt.Sprintf("t%07d", i), Class: "write"}
	}
	tb.keys.publish()
	return tb, keys
}

// benchAllowHeld runs the client's lock-free hot path (its clock reading,
// allowFast and the decision it builds, as Client.Allow does) in parallel, each goroutine
// visiting the keys in a scattered order of its own.
func benchAllowHeld(b *testing.B, n int) {
	tb, keys := heldTable(b, n)
	var missed, start atomic.Int64
	var sink atomic.Int64
	stride := 7919 % len(keys)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(start.Add(7)) * 104729 % len(keys)
		var rem int64
		for pb.Next() {
			in, remaining, _, ok := tb.allowFast(keys[i], 1, instant(time.Since(tb.zero)))
			if !ok {
				missed.Add(1)
			} else {
				rem += admitted(in, remaining).Remaining
			}
			if i += stride; i >= len(keys) {
				i -= len(keys)
			}
		}
		sink.Add(rem)
	})
	b.StopTimer()
	if m := missed.Load(); m > 0 {
		b.Fatalf("%d of %d requests missed the hot path", m, b.N)
	}
}

// BenchmarkAllowHeldKey: the hot path on one held key.
func BenchmarkAllowHeldKey(b *testing.B) { benchAllowHeld(b, 1) }

// BenchmarkAllowHeldKeys: the hot path over 100,000 held keys, mostly out
// of cache: what a held key's layout costs a decision.
func BenchmarkAllowHeldKeys(b *testing.B) { benchAllowHeld(b, 100_000) }
