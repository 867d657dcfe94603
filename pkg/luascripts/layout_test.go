package luascripts

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// leaseField is the bucket hash's field of instance id's lease record
// (lib.lua, "Layouts").
func leaseField(id string) string { return LeaseField(id) }

// bucketField is the named field of a bucket hash's fields as stored: a
// field left out is 0 (lib.lua, save_bucket).
func bucketField(bucket map[string]string, name string) string {
	if v, ok := bucket[name]; ok {
		return v
	}
	return "0"
}

// leaseRecords returns the lease records k's bucket holds, by instance id.
func leaseRecords(ctx context.Context, t testing.TB, rdb *redis.Client, k Keys) map[string]string {
	t.Helper()
	all, err := rdb.HGetAll(ctx, k.Bucket).Result()
	if err != nil {
		t.Fatal(err)
	}
	return recordsOf(all)
}

// recordsOf picks the lease records out of a bucket hash's fields.
func recordsOf(bucket map[string]string) map[string]string {
	out := map[string]string{}
	for f, v := range bucket {
		if id, ok := strings.CutPrefix(f, "#"); ok {
			out[id] = v
		}
	}
	return out
}

// leaseRecord returns instance id's lease record in k's bucket ("" when
// it has none).
func leaseRecordOf(ctx context.Context, t testing.TB, rdb *redis.Client, k Keys, id string) string {
	t.Helper()
	rec, err := rdb.HGet(ctx, k.Bucket, leaseField(id)).Result()
	if err != nil && err != redis.Nil {
		t.Fatal(err)
	}
	return rec
}

// toOlderLayout rewrites k as older scripts stored it (lib.lua,
// "Layouts"): its lease records in the lease hash (with the bucket's TTL)
// and its tokens in 'tk'.
func toOlderLayout(ctx context.Context, t testing.TB, rdb *redis.Client, k Keys) {
	t.Helper()
	all, err := rdb.HGetAll(ctx, k.Bucket).Result()
	if err != nil {
		t.Fatal(err)
	}
	ttl := rdb.PTTL(ctx, k.Bucket).Val()
	for id, rec := range recordsOf(all) {
		if err := rdb.HSet(ctx, k.Leases, id, rec).Err(); err != nil {
			t.Fatal(err)
		}
		rdb.HDel(ctx, k.Bucket, leaseField(id))
	}
	if ttl > 0 {
		rdb.PExpire(ctx, k.Leases, ttl)
	}
	// Older scripts wrote every field, the tokens as tk.
	for _, f := range bucketFields {
		if _, ok := all[f]; !ok {
			rdb.HSet(ctx, k.Bucket, f, "0")
		}
	}
	rdb.HSet(ctx, k.Bucket, "tk", bucketField(all, "t"))
	rdb.HDel(ctx, k.Bucket, "t", "n", "xe")
}

// TestOlderBucketMovesIntoThisLayout: a bucket older scripts wrote (every
// field, the tokens in tk, the lease records in a lease hash of their own)
// is moved into this layout by the first call that loads it, whatever the
// call: the tokens in t, no tk, the records in the bucket counted in n, no
// lease hash; a bucket with no lease keeps no n. The tokens are those the
// older scripts left.
func TestOlderBucketMovesIntoThisLayout(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	sc := newVirtual()
	now := int64(1_800_000_000_000_000)
	sc.setNow(now)
	c := Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Minute, ReapBudget: 8, DemandWindow: time.Millisecond}
	strict := KeysFor(DefaultPrefix, quota.Key{Tenant: "strict", Class: "read"})
	leased := KeysFor(DefaultPrefix, quota.Key{Tenant: "leased", Class: "read"})
	if r, err := sc.Check(ctx, rdb, strict, c, 1); err != nil || !r.Allowed {
		t.Fatalf("check: %+v, %v", r, err)
	}
	if r, err := sc.Sync(ctx, rdb, leased, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 3, Min: 1}); err != nil || r.Granted != 3 {
		t.Fatalf("lease: %+v, %v", r, err)
	}
	for _, k := range []Keys{strict, leased} {
		toOlderLayout(ctx, t, rdb, k)
	}
	if rdb.HGet(ctx, leased.Bucket, "tk").Val() != "7.000000" || rdb.HLen(ctx, leased.Leases).Val() != 1 {
		t.Fatalf("older layout not written: %v, lease hash %v", rdb.HGetAll(ctx, leased.Bucket).Val(), rdb.HGetAll(ctx, leased.Leases).Val())
	}
	// A state read that changes nothing else moves the key all the same.
	for _, tc := range []struct {
		k      Keys
		leases int
		tokens float64
	}{{strict, 0, 9}, {leased, 1, 7}} {
		st, err := sc.State(ctx, rdb, tc.k, c)
		if err != nil || st.Tokens != tc.tokens {
			t.Fatalf("%s: state %+v, %v; want %v tokens, as the older scripts left", tc.k.Bucket, st, err, tc.tokens)
		}
		b := rdb.HGetAll(ctx, tc.k.Bucket).Val()
		n, hasN := b["n"]
		if b["tk"] != "" || b["t"] == "" || len(recordsOf(b)) != tc.leases || hasN != (tc.leases > 0) ||
			(hasN && n != strconv.Itoa(tc.leases)) || rdb.Exists(ctx, tc.k.Leases).Val() != 0 {
			t.Fatalf("%s after the move: %v, lease hash kept %v; want t, no tk, %d records counted in n, no lease hash",
				tc.k.Bucket, b, rdb.Exists(ctx, tc.k.Leases).Val(), tc.leases)
		}
	}
}
