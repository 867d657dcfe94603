package luascripts

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Peeking reads what a Model (or, ReadGrant, a Redis) stores without
// running a script: no refill, no reaping, no TTL refresh. The
// simulator's oracle judges the scripts' results through it after every
// call, which must not change them.

// Peek is a key's bucket as stored.
type Peek struct {
	// NowUS is the Redis time of the last write (the bucket's ts).
	NowUS int64
	// Tokens in the bucket; Outstanding, the unspent tokens of live leases.
	Tokens, Outstanding float64
	// GrantRate, GrantBurst and GrantExpiryUS are the stored grant (zero
	// when none was ever applied).
	GrantRate, GrantBurst float64
	GrantExpiryUS         int64
	// Admitted and Denied are the cumulative counters.
	Admitted, Denied int64
}

// PeekBucket returns k's stored bucket, false when there is none (a held
// key's demand alone is none: see Common.AwaitingShare).
func (m *Model) PeekBucket(k Keys) (Peek, bool) {
	b, ok := m.buckets[k.Bucket]
	if !ok || b.held {
		return Peek{}, false
	}
	return Peek{
		NowUS: int64(b.ts), Tokens: b.tk, Outstanding: b.out, GrantRate: b.gr, GrantBurst: b.gb,
		GrantExpiryUS: int64(b.ge), Admitted: int64(b.adm), Denied: int64(b.den),
	}, true
}

// PeekLease returns instance's stored lease on k, false when there is none.
func (m *Model) PeekLease(k Keys, instance string) (LeaseRecord, bool) {
	ls, ok := m.leases[k.Bucket]
	if !ok {
		return LeaseRecord{}, false
	}
	l, ok := ls.byID[instance]
	if !ok {
		return LeaseRecord{}, false
	}
	return LeaseRecord{Granted: l.g, Used: l.u, Returned: l.r, Seq: uint64(l.seq), ExpiryUS: int64(l.exp), LastGrant: l.lg,
		WindowStartUS: int64(l.lt), WindowDemand: l.pd, DemandRate: l.dr / 1000,
		AppliedUsed: l.au, AppliedDenied: l.ad, AppliedReturned: l.ar, Lease: uint64(l.le), Incarnation: l.inc,
		Fingerprint: true}, true
}

// StoredGrant is a key's grant as set_rate stored it in the bucket: rate
// (tokens/s), burst cap (tokens), expiry (Redis time, µs) and fence (µs:
// when the region sent the report the grant answers; set_rate refuses a
// grant whose fence is below the one stored).
type StoredGrant struct {
	Rate, Burst       float64
	ExpiryUS, FenceUS int64
}

// ReadGrant reads k's stored grant from Redis without running a script;
// ok is false when k has no bucket or its bucket never held a grant. What
// it reads may be expired: compare ExpiryUS with Redis time.
func ReadGrant(ctx context.Context, c redis.Cmdable, k Keys) (g StoredGrant, ok bool, err error) {
	vals, err := c.HMGet(ctx, k.Bucket, grantFields...).Result()
	if err != nil {
		return g, false, fmt.Errorf("read grant of %s: %w", k.Bucket, err)
	}
	return parseGrant(k, vals)
}

// grantFields are the bucket fields ReadGrant reads: a field left out is
// 0 (lib.lua, save_bucket); no ts, no bucket.
var grantFields = []string{bucketFields[fieldTS], bucketFields[fieldGR], bucketFields[fieldGB], bucketFields[fieldGE], bucketFields[fieldGS]}

// GrantLife is a key's stored grant with how long the bucket that holds
// it lives at the least: ReadGrantLife's answer.
type GrantLife struct {
	Grant StoredGrant
	// Held is false when the key had no bucket or its bucket never held
	// a grant (ReadGrant's ok).
	Held bool
	// NowUS is Redis time at the read.
	NowUS int64
	// UntilUS is the Redis time until which the bucket read, or one that
	// keeps its fence, is certain to be there: a bucket goes only when
	// its TTL runs out, every call renews the TTL for at least
	// MinBucketTTL, and a call never lowers the stored fence. Past it the
	// key may have idled out, and a new bucket holds no fence: a delayed
	// grant installed there is taken whatever its fence. 0 when no bucket.
	UntilUS int64
}

// ReadGrantLife reads k's stored grant as ReadGrant does, with Redis time
// and the bucket's TTL in the same transaction, and works out from them
// until when the fence read stays in Redis (GrantLife.UntilUS) under
// leaseTTL, the lease TTL of the calls that write the key.
func ReadGrantLife(ctx context.Context, c redis.Cmdable, k Keys, leaseTTL time.Duration) (GrantLife, error) {
	var now *redis.TimeCmd
	var vals *redis.SliceCmd
	var ttl *redis.DurationCmd
	if _, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		vals = p.HMGet(ctx, k.Bucket, grantFields...)
		ttl = p.PTTL(ctx, k.Bucket)
		return nil
	}); err != nil {
		return GrantLife{}, fmt.Errorf("read grant of %s: %w", k.Bucket, err)
	}
	g, ok, err := parseGrant(k, vals.Val())
	if err != nil {
		return GrantLife{}, err
	}
	life := GrantLife{Grant: g, Held: ok, NowUS: now.Val().UnixMicro()}
	if left := ttl.Val(); vals.Val()[0] != nil && left > 0 {
		life.UntilUS = life.NowUS + min(left, MinBucketTTL(leaseTTL)).Microseconds()
	}
	return life, nil
}

// MinBucketTTL is the least TTL a call that writes or renews a bucket
// sets under leaseTTL (lib.lua, bucket_ttl and save_held: twice the lease
// TTL and a second), so every lease issued from the bucket ends before it
// can idle out.
func MinBucketTTL(leaseTTL time.Duration) time.Duration {
	return 2*leaseTTL.Truncate(time.Millisecond) + time.Second
}

// parseGrant reads the grantFields' values of k's bucket.
func parseGrant(k Keys, vals []any) (g StoredGrant, ok bool, err error) {
	names := grantFields
	if vals[0] == nil {
		return g, false, nil
	}
	var nums [4]float64
	for i, v := range vals[1:] {
		if v == nil {
			continue
		}
		s, isStr := v.(string)
		if !isStr {
			return g, false, fmt.Errorf("%w: %s field %s is %T", ErrReply, k.Bucket, names[i+1], v)
		}
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return g, false, fmt.Errorf("%w: %s field %s %q: %v", ErrReply, k.Bucket, names[i+1], s, err)
		}
		nums[i] = x
	}
	g = StoredGrant{Rate: nums[0], Burst: nums[1], ExpiryUS: int64(nums[2]), FenceUS: int64(nums[3])}
	return g, g.ExpiryUS > 0, nil
}
