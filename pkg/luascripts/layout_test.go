package luascripts

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
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
	if tk, ok := all["t"]; ok {
		rdb.HSet(ctx, k.Bucket, "tk", tk)
	}
	rdb.HDel(ctx, k.Bucket, "t", "n")
}
