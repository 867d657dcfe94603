package luascripts

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// olderScripts are the scripts as they were before a key became one Redis
// key (testdata/older-layout, the scripts of 673d742's parent: the lease
// records in a lease hash of their own, the tokens in 'tk', every field
// written), on the virtual clock: what the replicas a rolling upgrade has
// not reached yet run beside the new ones (lib.lua, "Layouts";
// docs/operations.md, the upgrade paragraphs). Their Go side (keys and
// arguments) is this package's: the layout changed, the calls did not.
func olderScripts() *Scripts { return build(os.DirFS("testdata/older-layout"), true) }

// upgradeReport is instance id's report seq on its lease 1 of a key,
// having used used tokens in all, asking for want.
func upgradeReport(id string, seq uint64, want, used int64) Report {
	return Report{Instance: id, Incarnation: 7, Lease: 1, Seq: seq, Want: want, Min: 1, Used: used}
}

// upgradeOps are the calls a replica makes on a key, named, for one
// version of the scripts: instances a and i0 report on leases the test
// may have opened, z is new to every key.
func upgradeOps(ctx context.Context, sc *Scripts, rdb *redis.Client, k Keys, c Common, nowUS int64) map[string]func() error {
	rep := func(id string, seq uint64, want int64) Report { return upgradeReport(id, seq, want, 1) }
	return map[string]func() error{
		"check":         func() error { _, err := sc.Check(ctx, rdb, k, c, 1); return err },
		"state":         func() error { _, err := sc.State(ctx, rdb, k, c); return err },
		"reap":          func() error { _, err := sc.Reap(ctx, rdb, k, c); return err },
		"set_rate":      func() error { _, err := sc.SetRate(ctx, rdb, k, c, 20, 50, nowUS+5e6, nowUS, 0); return err },
		"sync of a":     func() error { _, err := sc.Sync(ctx, rdb, k, c, rep("a", 2, 5)); return err },
		"sync of new z": func() error { _, err := sc.Sync(ctx, rdb, k, c, rep("z", 1, 5)); return err },
		"acquire of z":  func() error { _, err := sc.Acquire(ctx, rdb, k, c, rep("z", 1, 5)); return err },
		"release of a":  func() error { _, err := sc.Release(ctx, rdb, k, c, rep("a", 2, 0)); return err },
		"release of i0": func() error { _, err := sc.Release(ctx, rdb, k, c, rep("i0", 2, 0)); return err },
		"batched state": func() error { return sc.StateMany(ctx, rdb, []KeyCommon{{Keys: k, Common: c}})[0].Err },
		"batched grant": func() error {
			return sc.SetRateMany(ctx, rdb, []SetRateItem{{Keys: k, Common: c, Rate: 20, Burst: 50, ExpiryUS: nowUS + 5e6, IssuedUS: nowUS}})[0].Err
		},
	}
}

// TestOlderScriptsChangeNothingOnThisLayout: every call of the older
// scripts on a key this layout wrote (a strict bucket, one lease, more
// leases than FEWLEASES with their expiry set, a released lease) fails,
// and leaves Redis exactly as it was (every key's fields, members and
// TTL): during a rolling upgrade an old replica's call on a key a new one
// touched changes nothing, and its instance retries elsewhere or decides
// by on_failure. Redis keeps what a script wrote before failing, so
// "nothing" is checked on every key.
func TestOlderScriptsChangeNothingOnThisLayout(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	cur, old := newVirtual(), olderScripts()
	now := int64(1_800_000_000_000_000)
	cur.setNow(now)
	c := Common{StaticRate: 10, StaticBurst: 100, LeaseTTL: time.Minute, Reclaim: true, ReapBudget: 8,
		DemandWindow: time.Millisecond, RestartWait: time.Second, MarkEvery: time.Millisecond}
	if _, err := cur.StampBorn(ctx, rdb, BornKeys(DefaultPrefix, false), true); err != nil {
		t.Fatal(err)
	}
	key := func(s string) Keys { return KeysFor(DefaultPrefix, quota.Key{Tenant: s, Class: "read"}) }
	rep := func(id string, seq uint64, want int64) Report { return upgradeReport(id, seq, want, 0) }
	strict, one, six, released := key("strict"), key("one"), key("six"), key("released")
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cur.Check(ctx, rdb, strict, c, 3))
	must(cur.Sync(ctx, rdb, one, c, rep("a", 1, 5)))
	for i := range 6 {
		must(cur.Sync(ctx, rdb, six, c, rep(fmt.Sprint("i", i), 1, 5)))
	}
	must(cur.Sync(ctx, rdb, released, c, rep("a", 1, 5)))
	must(cur.Release(ctx, rdb, released, c, rep("a", 2, 0)))
	if rdb.Exists(ctx, six.Expiry).Val() != 1 {
		t.Fatalf("six leases keep no expiry set: the case is not the one meant")
	}
	// A TTL no script sets here, so that one renewed before a failure
	// shows.
	const marked = 24 * time.Hour
	for _, name := range rdb.Keys(ctx, "*").Val() {
		if rdb.PTTL(ctx, name).Val() > 0 {
			rdb.PExpire(ctx, name, marked)
		}
	}
	// Later, and with every record expired: the older scripts would reap.
	later := now + 2*time.Minute.Microseconds()
	old.setNow(later)
	for _, k := range []Keys{strict, one, six, released} {
		for name, op := range upgradeOps(ctx, old, rdb, k, c, later) {
			before := snapshot(ctx, t, rdb)
			err := op()
			if err == nil {
				t.Errorf("%s: the older scripts' %s succeeded on this layout", k.Bucket, name)
			}
			if after := snapshot(ctx, t, rdb); !reflect.DeepEqual(before, after) {
				t.Errorf("%s: the older scripts' %s (%v) changed Redis\n before: %v\n after:  %v", k.Bucket, name, err, before, after)
			}
			for _, key := range rdb.Keys(ctx, "*").Val() {
				if ttl := rdb.PTTL(ctx, key).Val(); ttl > 0 && ttl < marked-time.Hour {
					t.Errorf("%s: the older scripts' %s (%v) set %s's TTL to %v", k.Bucket, name, err, key, ttl)
				}
			}
		}
	}
}

// TestOlderAndNewerScriptsTogetherStayWithinTheBucket runs the older and
// the current scripts side by side on the same keys, as the replicas of a
// region do while a rolling upgrade is under way, with instances that
// report to either: spending, giving back, releasing, strict checks, state
// reads and reaps in random order. What each key handed out (tokens
// granted in leases and admitted by checks, less those given back) never
// exceeds its burst plus its rate times the time elapsed (invariant 1 on
// the Redis clock), whichever version served each call. A key the current
// scripts wrote is in this layout, and every older call on it fails
// without changing anything; one only older scripts wrote is in theirs
// until a current call moves it.
func TestOlderAndNewerScriptsTogetherStayWithinTheBucket(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	rapid.Check(t, func(rt *rapid.T) {
		if err := rdb.FlushDB(ctx).Err(); err != nil {
			rt.Fatalf("flushdb: %v", err)
		}
		cur, old := newVirtual(), olderScripts()
		start := int64(1_800_000_000_000_000)
		if _, err := cur.StampBorn(ctx, rdb, BornKeys(DefaultPrefix, false), true); err != nil {
			rt.Fatal(err)
		}
		c := Common{
			StaticRate:   rapid.SampledFrom([]float64{1, 10}).Draw(rt, "rate"),
			StaticBurst:  rapid.SampledFrom([]float64{5, 20}).Draw(rt, "burst"),
			LeaseTTL:     time.Duration(rapid.IntRange(1000, 3000).Draw(rt, "ttl_ms")) * time.Millisecond,
			ReapBudget:   rapid.IntRange(0, 3).Draw(rt, "reap"),
			DemandWindow: time.Millisecond,
			RestartWait:  time.Second,
			MarkEvery:    time.Duration(rapid.SampledFrom([]int{0, 250}).Draw(rt, "mark_every_ms")) * time.Millisecond,
		}
		keys := []Keys{
			KeysFor(DefaultPrefix, quota.Key{Tenant: "k0", Class: "c"}),
			KeysFor(DefaultPrefix, quota.Key{Tenant: "k1", Class: "c"}),
		}
		// An instance's view of its lease on a key.
		type lease struct {
			le, seq        uint64
			used, returned int64
			held           int64
		}
		leases := map[string]*lease{}
		leaseOf := func(k, id string) *lease {
			l := leases[k+"/"+id]
			if l == nil {
				l = &lease{le: 1}
				leases[k+"/"+id] = l
			}
			return l
		}
		net := map[string]float64{} // tokens handed out less those given back, by bucket
		now := start
		for step := range rapid.IntRange(1, 40).Draw(rt, "steps") {
			now += rapid.Int64Range(0, 1_500_000).Draw(rt, "dt_us")
			cur.setNow(now)
			old.setNow(now)
			newer := rapid.Bool().Draw(rt, "newer")
			sc, who := cur, "current"
			if !newer {
				sc, who = old, "older"
			}
			k := keys[rapid.IntRange(0, len(keys)-1).Draw(rt, "key")]
			id := rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "instance")
			l := leaseOf(k.Bucket, id)
			bucket := rdb.HGetAll(ctx, k.Bucket).Val()
			_, hasTS := bucket["ts"]
			_, hasTK := bucket["tk"]
			thisLayout := hasTS && !hasTK
			before := snapshot(ctx, rt, rdb)
			var err error
			switch op := rapid.SampledFrom([]string{"sync", "acquire", "release", "check", "state", "reap"}).Draw(rt, "op"); op {
			case "sync", "acquire":
				spend := rapid.Int64Range(0, max(l.held, 0)).Draw(rt, "spend")
				back := rapid.Int64Range(0, max(l.held-spend, 0)).Draw(rt, "give_back")
				r := Report{Instance: id, Incarnation: 7, Lease: l.le, Seq: l.seq + 1, Used: l.used + spend,
					Returned: l.returned + back, Want: rapid.Int64Range(0, 6).Draw(rt, "want"), Min: 1}
				var lr LeaseReply
				if op == "sync" {
					lr, err = sc.Sync(ctx, rdb, k, c, r)
				} else {
					lr, err = sc.Acquire(ctx, rdb, k, c, r)
				}
				if err != nil {
					break
				}
				net[k.Bucket] += float64(lr.Granted - lr.Returned)
				if lr.Conflict {
					*l = lease{le: l.le + 1}
					break
				}
				l.seq, l.used, l.returned = r.Seq, r.Used, r.Returned
				l.held += lr.Granted - spend - back
			case "release":
				spend := rapid.Int64Range(0, max(l.held, 0)).Draw(rt, "spend")
				r := Report{Instance: id, Incarnation: 7, Lease: l.le, Seq: l.seq + 1, Used: l.used + spend, Returned: l.returned}
				var rr ReleaseReply
				if rr, err = sc.Release(ctx, rdb, k, c, r); err == nil {
					net[k.Bucket] -= float64(rr.Returned)
					*l = lease{le: l.le + 1}
				}
			case "check":
				cost := rapid.Int64Range(1, 3).Draw(rt, "cost")
				var cr CheckReply
				if cr, err = sc.Check(ctx, rdb, k, c, cost); err == nil && cr.Allowed {
					net[k.Bucket] += float64(cost)
				}
			case "state":
				_, err = sc.State(ctx, rdb, k, c)
			case "reap":
				_, err = sc.Reap(ctx, rdb, k, c)
			}
			switch {
			case newer && err != nil:
				rt.Fatalf("step %d: the current scripts failed on %s: %v", step, k.Bucket, err)
			case !newer && thisLayout && err == nil:
				rt.Fatalf("step %d: the older scripts succeeded on %s in this layout %v", step, k.Bucket, bucket)
			case !newer && !thisLayout && err != nil:
				rt.Fatalf("step %d: the older scripts failed on %s in their own layout: %v", step, k.Bucket, err)
			case err != nil:
				if after := snapshot(ctx, rt, rdb); !reflect.DeepEqual(before, after) {
					rt.Fatalf("step %d: the %s scripts failed (%v) and changed Redis\n before: %v\n after:  %v", step, who, err, before, after)
				}
				continue
			}
			b := rdb.HGetAll(ctx, k.Bucket).Val()
			if _, tk := b["tk"]; newer && (tk || rdb.Exists(ctx, k.Leases).Val() != 0) {
				rt.Fatalf("step %d: after a current call %s is not in this layout: %v, lease hash %v", step, k.Bucket, b, rdb.HGetAll(ctx, k.Leases).Val())
			}
			bound := c.StaticBurst + c.StaticRate*float64(now-start)/1e6
			if net[k.Bucket] > bound+1e-6 {
				rt.Fatalf("step %d: %s handed out %v tokens net, above b + r·t = %v (%s scripts' call)", step, k.Bucket, net[k.Bucket], bound, who)
			}
			for f := range b {
				if strings.HasPrefix(f, "#") && !newer && hasTK {
					rt.Fatalf("step %d: the older scripts wrote a record into the bucket: %v", step, b)
				}
			}
		}
	})
}
