package regional_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/shard"
)

// TestEtcdRuleExtendsOnlyTheShardsWithNoGlobalLeader: under a config of
// two global-tier shards, the etcd rule is read shard by shard. With
// shard 0's allocator elected and shard 1's election empty, only shard 1's
// running lease is extended (to about Redis time + region_lease); shard
// 0's stays where its last answer left it. Once a candidate holds shard
// 1's election too, neither grows.
func TestEtcdRuleExtendsOnlyTheShardsWithNoGlobalLeader(t *testing.T) {
	ctx := context.Background()
	// An epoch of a second bounds the extension's reads: a starved
	// machine still fits them in most attempts.
	r := newLeaseRigWith(t, regiontest.MustConfig(t, `
epoch: 1s
lease_ttl: 1m
region_lease: 20s
global_shards: 2
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease, partition_share: 0.5}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`))
	lease := time.Duration(r.cfg.RegionLease).Microseconds()
	storedOf := func(i int) int64 {
		t.Helper()
		key := staticKey
		if i > 0 {
			key = fmt.Sprintf("%s:%d", staticKey, i)
		}
		v, err := r.rdb.Get(ctx, key).Int64()
		if errors.Is(err, redis.Nil) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// Both shards' leases running, half a region lease ahead: an extension
	// (Redis time + region_lease) would move either.
	until := r.redisUS() + lease/2
	for _, key := range []string{staticKey, staticKey + ":1"} {
		if err := r.rdb.Set(ctx, key, fmt.Sprint(until), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// noGlobalLeader runs the rule until an attempt finishes within its
	// bound (an epoch), as the leader tries again at its next failed sync.
	noGlobalLeader := func() (bool, int64) {
		t.Helper()
		for deadline := time.Now().Add(time.Duration(r.cfg.RegionLease) / 4); ; {
			before := r.redisUS()
			grew, err := r.leader.NoGlobalLeader(ctx)
			if err == nil {
				return grew, before
			}
			if !errors.Is(err, context.DeadlineExceeded) || time.Now().After(deadline) {
				t.Fatal(err)
			}
			t.Logf("extension attempt timed out: %v", err)
		}
	}
	grew, before := noGlobalLeader()
	if !grew {
		t.Fatal("shard 1 has no global leader elected, yet no lease grew")
	}
	if got := storedOf(0); got != until {
		t.Fatalf("shard 0's lease moved from %d to %d with its global leader elected", until, got)
	}
	ext := storedOf(1)
	if ext < before+lease || ext > r.redisUS()+lease {
		t.Fatalf("shard 1's extended lease ends at %d, want about Redis time %d + region_lease %d", ext, before, lease)
	}
	// A candidate in shard 1's election (which never answers): no more
	// extensions of either lease.
	sess, err := concurrency.NewSession(r.cli, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := concurrency.NewElection(sess, "/sl/election/"+shard.ElectionName(1)).Campaign(ctx, "unreachable"); err != nil {
		t.Fatal(err)
	}
	if grew, _ := noGlobalLeader(); grew {
		t.Fatal("a lease grew with every shard's global leader elected")
	}
	if got0, got1 := storedOf(0), storedOf(1); got0 != until || got1 != ext {
		t.Fatalf("leases moved with every shard's global leader elected: shard 0 %d (was %d), shard 1 %d (was %d)", got0, until, got1, ext)
	}
}
