package luascripts

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestReadGrantIsWhatSetRateStored: ReadGrant gives back exactly the
// grant set_rate stored (the rate and burst to the bit, the expiry and
// the fence), the newer one after a second grant and the stored one after
// an older grant was refused; a key without a bucket, or with a bucket
// that never held a grant, has none. Reading changes nothing.
func TestReadGrantIsWhatSetRateStored(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	sc := newVirtual()
	now := int64(1_800_000_000_000_000)
	sc.setNow(now)
	c := Common{StaticRate: 10, StaticBurst: 20, LeaseTTL: time.Second, ReapBudget: 1, DemandWindow: time.Millisecond}
	granted := KeysFor(DefaultPrefix, quota.Key{Tenant: "g", Class: "c"})
	strict := KeysFor(DefaultPrefix, quota.Key{Tenant: "s", Class: "c"})
	missing := KeysFor(DefaultPrefix, quota.Key{Tenant: "m", Class: "c"})

	for _, k := range []Keys{granted, strict, missing} {
		if _, ok, err := ReadGrant(ctx, rdb, k); ok || err != nil {
			t.Fatalf("%s before any call: a grant (%v, %v)", k.Bucket, ok, err)
		}
	}
	if _, err := sc.Check(ctx, rdb, strict, c, 1); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ReadGrant(ctx, rdb, strict); ok || err != nil {
		t.Fatalf("a bucket that never held a grant has one (%v, %v)", ok, err)
	}

	first := StoredGrant{Rate: 1.0 / 3, Burst: 12.5, ExpiryUS: now + 5_000_000, FenceUS: now - 1_000}
	second := StoredGrant{Rate: 7.25, Burst: 3, ExpiryUS: now + 6_000_000, FenceUS: now - 500}
	older := StoredGrant{Rate: 100, Burst: 100, ExpiryUS: now + 9_000_000, FenceUS: now - 2_000}
	for _, step := range []struct {
		g       StoredGrant
		applied bool
		want    StoredGrant
	}{{first, true, first}, {second, true, second}, {older, false, second}} {
		r, err := sc.SetRate(ctx, rdb, granted, c, step.g.Rate, step.g.Burst, step.g.ExpiryUS, step.g.FenceUS, 0)
		if err != nil || r.Applied != step.applied {
			t.Fatalf("set_rate %+v: applied %v (%v), want %v", step.g, r.Applied, err, step.applied)
		}
		before := snapshot(ctx, t, rdb)
		got, ok, err := ReadGrant(ctx, rdb, granted)
		if err != nil || !ok || got != step.want {
			t.Fatalf("after set_rate %+v: read %+v (%v, %v), want %+v", step.g, got, ok, err, step.want)
		}
		if after := snapshot(ctx, t, rdb); len(after) != len(before) || after[granted.Bucket]["ts"] != before[granted.Bucket]["ts"] {
			t.Fatalf("reading the grant changed Redis")
		}
	}
	if err := rdb.Set(ctx, missing.Bucket, "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ReadGrant(ctx, rdb, missing); err == nil {
		t.Fatal("a bucket key of another type read without an error")
	}
}

// TestReadGrantLifeIsTheLeastTheBucketStays: ReadGrantLife reads the grant
// ReadGrant reads, and its UntilUS is the read's Redis time plus the
// bucket's TTL, capped at MinBucketTTL. A bucket whose grant ended and
// whose static share refills at once lives exactly MinBucketTTL (the
// floor the scripts set), so the cap is reached and no call sets less; a
// key without a bucket has no grant and no life.
func TestReadGrantLifeIsTheLeastTheBucketStays(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	sc := newVirtual()
	now := int64(1_800_000_000_000_000)
	sc.setNow(now)
	c := Common{StaticRate: 1e6, StaticBurst: 1, LeaseTTL: 1500 * time.Millisecond, ReapBudget: 1, DemandWindow: time.Millisecond}
	floor := MinBucketTTL(c.LeaseTTL)
	if floor != 4*time.Second {
		t.Fatalf("MinBucketTTL(%v) = %v, want 4s", c.LeaseTTL, floor)
	}
	ended := KeysFor(DefaultPrefix, quota.Key{Tenant: "e", Class: "c"})
	long := KeysFor(DefaultPrefix, quota.Key{Tenant: "l", Class: "c"})
	missing := KeysFor(DefaultPrefix, quota.Key{Tenant: "m", Class: "c"})

	life, err := ReadGrantLife(ctx, rdb, missing, c.LeaseTTL)
	if err != nil || life.Held || life.UntilUS != 0 || life.NowUS == 0 {
		t.Fatalf("no bucket: %+v (%v), want no grant, no life, the read's time", life, err)
	}
	for _, g := range []struct {
		k Keys
		StoredGrant
	}{
		{ended, StoredGrant{Rate: 2, Burst: 1, ExpiryUS: now - 1_000_000, FenceUS: now - 2_000_000}},
		{long, StoredGrant{Rate: 2, Burst: 1, ExpiryUS: now + 600_000_000, FenceUS: now - 1_000}},
	} {
		if r, err := sc.SetRate(ctx, rdb, g.k, c, g.Rate, g.Burst, g.ExpiryUS, g.FenceUS, 0); err != nil || !r.Applied {
			t.Fatalf("set_rate %+v: %+v (%v)", g.StoredGrant, r, err)
		}
		life, err := ReadGrantLife(ctx, rdb, g.k, c.LeaseTTL)
		if err != nil || !life.Held || life.Grant != g.StoredGrant {
			t.Fatalf("%s: read %+v (%v), want %+v", g.k.Bucket, life, err, g.StoredGrant)
		}
		pttl, err := rdb.PTTL(ctx, g.k.Bucket).Result()
		if err != nil {
			t.Fatal(err)
		}
		left := time.Duration(life.UntilUS-life.NowUS) * time.Microsecond
		switch g.k {
		case ended:
			// The floor itself: set by the install, read a moment later.
			if left > floor || left < pttl || left < floor-time.Second {
				t.Fatalf("a bucket at the floor: life %v, TTL now %v, floor %v", left, pttl, floor)
			}
		case long:
			if left != floor || pttl <= floor {
				t.Fatalf("a bucket living past the floor: life %v (want the floor %v), TTL %v", left, floor, pttl)
			}
		}
	}
}
