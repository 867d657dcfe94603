package luascripts

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// awaitedRig is a twin (the Lua scripts on a real redis-server and Model
// at the same virtual instant, replies and stored state alike) that can
// date its data set's birth and move its clock.
type awaitedRig struct{ *twin }

func newAwaitedRig(t *testing.T) *awaitedRig {
	r := &awaitedRig{newTwin(t)}
	r.at(1_700_000_000_000_000)
	return r
}

// stampLongAgo dates the data set a day before now: a Redis that has run
// for long (a missing bucket of 100 an hour is credited from its birth).
func (r *awaitedRig) stampLongAgo(k Keys) {
	r.t.Helper()
	born := r.now - int64(24*time.Hour/time.Microsecond)
	r.m.StampBorn(born, k.Born, false)
	r.sc.setNow(born)
	if _, err := r.sc.StampBorn(r.ctx, r.rdb, []string{k.Born}, false); err != nil {
		r.t.Fatal(err)
	}
	r.sc.setNow(r.now)
}

func (r *awaitedRig) advance(d time.Duration) {
	r.at(r.now + d.Microseconds())
	r.expire()
}

func (r *awaitedRig) hasBucket(k Keys) bool {
	r.t.Helper()
	ts, err := r.rdb.HExists(r.ctx, k.Bucket, "ts").Result()
	if err != nil {
		r.t.Fatal(err)
	}
	if !ts && len(leaseRecords(r.ctx, r.t, r.rdb, k)) > 0 {
		r.t.Fatalf("%s: lease records without a bucket", k.Bucket)
	}
	return ts
}

// A class of 100 an hour, burst 100, in a region of its own: its share
// once the config adding it is confirmed.
var hourlyShare = Common{StaticRate: 100.0 / 3600, StaticBurst: 100, LeaseTTL: 5 * time.Second, ReapBudget: 8,
	DemandWindow: 500 * time.Millisecond, MarkEvery: 250 * time.Millisecond, RestartWait: 6 * time.Second}

// zeroOf is c with no static share: the region's rate and burst while the
// config adding the class is not confirmed, or its floor at a
// partition_share of 0.
func zeroOf(c Common, awaiting bool) Common {
	c.StaticRate, c.StaticBurst, c.AwaitingShare = 0, 0, awaiting
	return c
}

// TestAwaitedShareIsBornFull: a class added by a config the global tier has
// not confirmed yet runs a static share of 0 in the region; a key first
// used then is refused, and once its share arrives it admits its full
// burst, as a key first used then does. Its refused demand shows in the
// key's state and candidate mark meanwhile. A key whose cap of 0 is a
// floor (drained, or off the static lease at partition_share 0) keeps
// being created empty: once its share arrives it is short of it (the
// scripts before the fix did that to the awaited key too: 0 tokens
// granted where 100 were due).
func TestAwaitedShareIsBornFull(t *testing.T) {
	r := newAwaitedRig(t)
	awaited := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "hourly"})
	floor := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme2", Class: "hourly"})
	r.stampLongAgo(awaited)

	for step := range 3 {
		lr := r.acquire(awaited, zeroOf(hourlyShare, true), Report{Instance: "i-1", Seq: uint64(step + 1), Lease: uint64(step + 1), Want: 10, Min: 1})
		if lr.Granted != 0 || lr.RetryAfter != -1 || lr.TTL != 0 || lr.Live != 0 {
			t.Fatalf("held acquire %d: %+v, want nothing granted, never, no lease", step, lr)
		}
		if cr := r.check(awaited, zeroOf(hourlyShare, true), 1); cr.Allowed || cr.RetryAfter != -1 {
			t.Fatalf("held check %d: %+v, want denied, never", step, cr)
		}
		if r.hasBucket(awaited) {
			t.Fatalf("step %d: a held key got a bucket", step)
		}
		r.advance(300 * time.Millisecond)
	}
	st := r.state(awaited, zeroOf(hourlyShare, true))
	if st.StrictDemand != 6 || st.Denied != 3 || st.Admitted != 0 {
		t.Fatalf("held key's state %+v, want strict demand 6 (3 lease asks of 1, 3 checks of 1), denied 3", st)
	}
	if _, ok := r.m.Candidates(awaited.Cand)[awaited.Member]; !ok {
		t.Fatalf("held key never marked a candidate: %v", r.m.Candidates(awaited.Cand))
	}
	if r.hasBucket(awaited) {
		t.Fatal("a state read gave a held key a bucket")
	}
	if _, ok := r.m.PeekBucket(awaited); ok {
		t.Fatal("the Model's PeekBucket found a bucket for a held key (its demand alone)")
	}

	// The same calls on a floor of 0 create the bucket empty.
	r.acquire(floor, zeroOf(hourlyShare, false), Report{Instance: "i-1", Seq: 1, Lease: 1, Want: 10, Min: 1})
	if !r.hasBucket(floor) {
		t.Fatal("a floor of 0 created no bucket")
	}

	// The config is confirmed one round later: the share arrives.
	r.advance(time.Second)
	if lr := r.acquire(awaited, hourlyShare, Report{Instance: "i-1", Seq: 9, Lease: 9, Want: 100, Min: 1}); lr.Granted != 100 {
		t.Fatalf("awaited key once its share arrived: granted %d of its burst 100 (%+v)", lr.Granted, lr)
	}
	if st := r.state(awaited, hourlyShare); st.StrictDemand != 6 || st.Denied != 3 {
		t.Fatalf("born bucket's counters %+v, want the held key's demand carried on", st)
	}
	lr := r.acquire(floor, hourlyShare, Report{Instance: "i-1", Seq: 2, Lease: 1, Want: 100, Min: 1})
	if lr.Granted != 0 {
		t.Fatalf("key created at a floor of 0: granted %d once its share arrived, want it to climb at its rate", lr.Granted)
	}
}

// TestAwaitedShareNeverStartsAGrantFull: a grant reaching a held key
// creates its bucket empty, as every grant does, and the region then holds
// no more than the grant's refill: a grant is capacity the global tier
// fenced, never tokens. The region's holdings stay within b_r + r_r·t of
// the grant from its start (b_r = 0 before it).
func TestAwaitedShareNeverStartsAGrantFull(t *testing.T) {
	r := newAwaitedRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "hourly"})
	r.stampLongAgo(k)
	c := zeroOf(hourlyShare, true)
	r.check(k, c, 1)
	start := r.now
	const rate, burst = 10.0, 50.0
	if sr := r.setRate(k, c, rate, burst, r.now+int64(10*time.Second/time.Microsecond), r.now); !sr.Applied || sr.Tokens != 0 {
		t.Fatalf("grant on a held key: %+v, want applied on an empty bucket", sr)
	}
	var admitted int64
	for range 20 {
		r.advance(200 * time.Millisecond)
		if cr := r.check(k, c, 1); cr.Allowed {
			admitted++
		}
		lr := r.acquire(k, c, Report{Instance: "i-1", Seq: uint64(r.now), Lease: 1, Want: 5, Min: 1})
		admitted += lr.Granted
		if bound := rate * float64(r.now-start) / 1e6; float64(admitted) > bound {
			t.Fatalf("admitted %d by %v into the grant, above r·t = %.3f", admitted, time.Duration(r.now-start)*time.Microsecond, bound)
		}
	}
	if admitted == 0 {
		t.Fatal("the grant admitted nothing in 4 s at 10/s")
	}
}

// TestAwaitedShareAfterRedisLostItsData: a held key leaves the born
// sentinel as it is; once its share arrives it is born as any missing
// bucket is, so in a data set born inside the restart wait it starts
// empty and earns nothing until the wait ends.
func TestAwaitedShareAfterRedisLostItsData(t *testing.T) {
	r := newAwaitedRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "hourly"})
	// No sentinel: the data set is new (Redis lost its data). A held call
	// dates nothing, nor does a state read of the held key (one that
	// stamped the data set would write its bucket too).
	r.acquire(k, zeroOf(hourlyShare, true), Report{Instance: "i-1", Seq: 1, Lease: 1, Want: 10, Min: 1})
	r.state(k, zeroOf(hourlyShare, true))
	if _, ok := r.m.BornOf(k.Born); ok || r.rdb.Exists(r.ctx, k.Born).Val() != 0 {
		t.Fatal("a held call or a state read of the held key wrote the born sentinel")
	}
	if r.hasBucket(k) {
		t.Fatal("a state read gave a held key a bucket")
	}
	r.advance(time.Second)
	lr := r.acquire(k, hourlyShare, Report{Instance: "i-1", Seq: 2, Lease: 2, Want: 100, Min: 1})
	if lr.Granted != 0 {
		t.Fatalf("first bucket of a data set born now: granted %d inside the restart wait", lr.Granted)
	}
	born, ok := r.m.BornOf(k.Born)
	if !ok || born != r.now {
		t.Fatalf("born %d (%v), want dated by the call that created the bucket (%d)", born, ok, r.now)
	}
}

// TestAwaitedShareOnAnExistingBucket: only a missing key is held. A bucket
// that exists (a class removed and added back within the bucket's TTL)
// runs at the cap it is handed, as before: clamped to 0, it refills from
// there once the share arrives, never more than its rate.
func TestAwaitedShareOnAnExistingBucket(t *testing.T) {
	r := newAwaitedRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "hourly"})
	r.stampLongAgo(k)
	if lr := r.acquire(k, hourlyShare, Report{Instance: "i-1", Seq: 1, Lease: 1, Want: 40, Min: 1}); lr.Granted != 40 {
		t.Fatalf("first batch: %+v", lr)
	}
	r.advance(time.Minute)
	if cr := r.check(k, zeroOf(hourlyShare, true), 1); cr.Allowed {
		t.Fatalf("check at a cap of 0: %+v", cr)
	}
	if !r.hasBucket(k) {
		t.Fatal("an existing bucket was held")
	}
	r.advance(time.Second)
	st := r.state(k, hourlyShare)
	if st.Tokens > hourlyShare.StaticRate*1.0+1e-6 {
		t.Fatalf("bucket clamped to 0 holds %v a second after its share came back, above its rate", st.Tokens)
	}
}

// TestAwaitedShareHoldsOnlyWhatAsksForTokens: a held key's lease request
// counts as demand of its min, at least 1 (a request with min 0 is one
// for a token), answered "never" with no lease, and marks the key a
// candidate on its own; a report asking for nothing, or one that may only
// book an existing lease, writes nothing, as on any missing key. The
// demand lives 2 x lease TTL + 1 s from the last held call.
func TestAwaitedShareHoldsOnlyWhatAsksForTokens(t *testing.T) {
	r := newAwaitedRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "hourly"})
	r.stampLongAgo(k)
	c := zeroOf(hourlyShare, true)
	exists := func() bool { return r.rdb.Exists(r.ctx, k.Bucket).Val() > 0 }

	r.sync(k, c, Report{Instance: "i-1", Seq: 1, Lease: 1})
	r.sync(k, c, Report{Instance: "i-1", Seq: 2, Lease: 2, Want: 5, Min: 1, BookOnly: true})
	if exists() {
		t.Fatal("a report asking for nothing, or only booking, wrote the held key's demand")
	}
	lr := r.acquire(k, c, Report{Instance: "i-1", Seq: 3, Lease: 3, Want: 5})
	if lr.Granted != 0 || lr.RetryAfter != -1 || lr.TTL != 0 || lr.Live != 0 {
		t.Fatalf("held acquire with min 0: %+v, want nothing granted, never, no lease", lr)
	}
	if _, ok := r.cands(k.Cand)[k.Member]; !ok {
		t.Fatal("a held lease request did not mark the key a candidate")
	}
	if st := r.state(k, c); st.StrictDemand != 1 {
		t.Fatalf("held key's strict demand %d after a request with min 0, want 1", st.StrictDemand)
	}
	ttl := 2*hourlyShare.LeaseTTL + time.Second
	// Redis's own clock runs between the call and the read.
	if got := r.rdb.PTTL(r.ctx, k.Bucket).Val(); got > ttl || got < ttl-time.Second {
		t.Fatalf("held demand's TTL %v, want 2 x lease TTL + 1s = %v", got, ttl)
	}
	r.advance(ttl - time.Millisecond)
	if st := r.state(k, c); st.StrictDemand != 1 {
		t.Fatalf("held key's strict demand %d just before its TTL, want 1 still", st.StrictDemand)
	}
	r.advance(time.Millisecond)
	if exists() {
		t.Fatal("held demand outlived its TTL")
	}
}

// TestAwaitedShareHoldsAKeyWhoseBucketWasEvicted: a key's lease records
// live in its bucket (lib.lua, "Layouts"), so a bucket evicted while an
// instance's lease on it lives takes the record along: the key is new
// again, and a check at an awaited cap of 0 holds it like any new key,
// in the scripts and the Model alike.
func TestAwaitedShareHoldsAKeyWhoseBucketWasEvicted(t *testing.T) {
	r := newAwaitedRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "hourly"})
	r.stampLongAgo(k)
	if lr := r.acquire(k, hourlyShare, Report{Instance: "i-1", Seq: 1, Lease: 1, Want: 2, Min: 1}); lr.Granted != 2 {
		t.Fatalf("lease of two tokens: %+v", lr)
	}
	if err := r.rdb.Del(r.ctx, k.Bucket).Err(); err != nil {
		t.Fatal(err)
	}
	delete(r.m.buckets, k.Bucket)
	delete(r.m.leases, k.Bucket)
	if cr := r.check(k, zeroOf(hourlyShare, true), 1); cr.Allowed {
		t.Fatalf("check at a cap of 0: %+v", cr)
	}
	if r.hasBucket(k) {
		t.Fatal("a key whose bucket was evicted was not held")
	}
}

// TestAwaitedShareOnlyAtACapOfZero: AwaitingShare speaks of a static burst
// of 0; with a positive one (a caller that set it anyway) a missing key
// is created at its cap as always.
func TestAwaitedShareOnlyAtACapOfZero(t *testing.T) {
	r := newAwaitedRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "hourly"})
	r.stampLongAgo(k)
	c := hourlyShare
	c.AwaitingShare = true
	if lr := r.acquire(k, c, Report{Instance: "i-1", Seq: 1, Lease: 1, Want: 100, Min: 1}); lr.Granted != 100 {
		t.Fatalf("missing key at a static burst of 100 flagged awaiting: %+v, want its burst granted", lr)
	}
	if !r.hasBucket(k) {
		t.Fatal("no bucket after a grant of 100")
	}
}

// TestAwaitedShareRebirthDropsTheOldDemand: a bucket older than its data
// set's birth (a Redis that lost its born sentinel) is deleted with all it
// counted: the bucket created in its place carries no denied or strict
// demand of the lost history, as only a held key's demand (a hash without
// ts) is carried into a new bucket.
func TestAwaitedShareRebirthDropsTheOldDemand(t *testing.T) {
	r := newAwaitedRig(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "hourly"})
	r.stampLongAgo(k)
	if cr := r.check(k, hourlyShare, 200); cr.Allowed {
		t.Fatalf("check of 200 against a burst of 100: %+v", cr)
	}
	if st := r.state(k, hourlyShare); st.Denied != 200 || st.StrictDemand != 200 {
		t.Fatalf("after a denied check of 200: %+v, want 200 denied and asked", st)
	}
	if err := r.rdb.Del(r.ctx, k.Born).Err(); err != nil {
		t.Fatal(err)
	}
	delete(r.m.born, k.Born)
	r.advance(time.Second)
	if st := r.state(k, hourlyShare); st.Denied != 0 || st.StrictDemand != 0 {
		t.Fatalf("bucket born again after its data set lost its sentinel: %+v, want nothing of the lost history", st)
	}
}
