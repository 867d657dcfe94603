package luascripts

import (
	"context"
	"math"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestStateReadChangesNoLaterCall: the region leader's state read that
// reaps nothing is invisible to every later call (one that reaps is a reap,
// and changes what a reap changes). Two keys with the same settings go
// through the same operations at the same instants on a real redis-server,
// and only key A is also read by the leader (single and batched state
// reads) in between; every other operation must give A and B the same
// reply and leave them the same stored bucket, lease records and candidate
// score, so no decision depends on whether or when the leader read. A
// state read must also renew the keys' TTLs as a writing read does
// (bucket_ttl at the read's instant, and the lease keys' while tokens are
// out), so a key the leader keeps reading never lapses earlier than it did
// when every read wrote the bucket back. The one thing a read takes is the
// tokens released under the grant (field rl, the burst transfer): only the
// leader's reports carry them, no call decides on them, so rl and the
// replies' Released are left out of the comparison.
func TestStateReadChangesNoLaterCall(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()

	rapid.Check(t, func(rt *rapid.T) {
		if err := rdb.FlushDB(ctx).Err(); err != nil {
			rt.Fatalf("flushdb: %v", err)
		}
		sc.forgetGenerations()
		now := int64(1_700_000_000_000_000) + rapid.Int64Range(0, 1e9).Draw(rt, "start")
		// TTLs of at least 2 x 5 s: no key expires in the real time a case
		// takes, so the harness never expires anything.
		c := Common{
			StaticRate:   rapid.SampledFrom([]float64{0.1, 1, 3, 66.666666666, 1.0 / 3, 1000}).Draw(rt, "rate"),
			StaticBurst:  rapid.SampledFrom([]float64{0, 0.5, 5, 20, 200}).Draw(rt, "burst"),
			LeaseTTL:     5 * time.Second,
			Reclaim:      rapid.Bool().Draw(rt, "reclaim"),
			ReapBudget:   rapid.IntRange(0, 3).Draw(rt, "reap"),
			DemandWindow: 300 * time.Millisecond,
			MarkEvery:    time.Duration(rapid.SampledFrom([]int{0, 1, 250}).Draw(rt, "mark_every_ms")) * time.Millisecond,
		}
		if rapid.Bool().Draw(rt, "guarded") {
			c.RestartWait = time.Duration(rapid.IntRange(1, 10_000).Draw(rt, "restart_wait_ms")) * time.Millisecond
		}
		ka := KeysFor(DefaultPrefix, quota.Key{Tenant: "a", Class: "read"})
		kb := KeysFor(DefaultPrefix, quota.Key{Tenant: "b", Class: "read"})
		// The data set is dated before any call (trusted full, or born a
		// while ago), so no call of A's dates it for B.
		sc.setNow(now - rapid.Int64Range(0, 20e6).Draw(rt, "born_ago"))
		if _, err := sc.StampBorn(ctx, rdb, []string{ka.Born}, rapid.Bool().Draw(rt, "trusted")); err != nil {
			rt.Fatalf("stamp: %v", err)
		}
		instances := []string{"i-a", "i-b", "i-c", "i-d", "i-e", "i-f"}
		seqs := map[string]uint64{}
		steps := rapid.IntRange(1, 50).Draw(rt, "steps")
		for step := 0; step < steps; step++ {
			now += rapid.SampledFrom([]int64{0, 1, 999, 50_000, 333_333, 1_000_000, 3_000_000}).Draw(rt, "dt")
			sc.setNow(now)
			var ra, rb any
			var ea, eb error
			switch opn := rapid.IntRange(0, 5).Draw(rt, "op"); opn {
			case 0, 1:
				// The leader reads A alone, reaping nothing.
				rc := c
				rc.ReapBudget = 0
				var st State
				if rapid.Bool().Draw(rt, "batched") {
					r := sc.StateMany(ctx, rdb, []KeyCommon{{Keys: ka, Common: rc}})[0]
					st, ea = r.State, r.Err
				} else {
					st, ea = sc.State(ctx, rdb, ka, rc)
				}
				if ea != nil {
					rt.Fatalf("step %d: state: %v", step, ea)
				}
				checkReadTTL(ctx, rt, rdb, ka, c, st)
				continue
			case 2:
				inst := rapid.SampledFrom(instances).Draw(rt, "instance")
				seqs[inst]++
				r := Report{Instance: inst, Incarnation: 9, Lease: 1, Seq: seqs[inst],
					Used: int64(seqs[inst]) * rapid.Int64Range(0, 40).Draw(rt, "used"),
					Want: rapid.Int64Range(0, 300).Draw(rt, "want"), Min: rapid.Int64Range(0, 20).Draw(rt, "min")}
				ra, ea = sc.Sync(ctx, rdb, ka, c, r)
				rb, eb = sc.Sync(ctx, rdb, kb, c, r)
			case 3:
				cost := rapid.Int64Range(1, 30).Draw(rt, "cost")
				ra, ea = sc.Check(ctx, rdb, ka, c, cost)
				rb, eb = sc.Check(ctx, rdb, kb, c, cost)
			case 4:
				rate := rapid.SampledFrom([]float64{0, 2, 40, 1.0 / 3, 399.99999999999994}).Draw(rt, "grant_rate")
				burst := rapid.SampledFrom([]float64{0, 7.5, 100, 2.0 / 3}).Draw(rt, "grant_burst")
				exp := now + rapid.Int64Range(-2e6, 10e6).Draw(rt, "grant_valid")
				issued := now - rapid.Int64Range(0, 3e6).Draw(rt, "issued_ago")
				ra, ea = sc.SetRate(ctx, rdb, ka, c, rate, burst, exp, issued, 0)
				rb, eb = sc.SetRate(ctx, rdb, kb, c, rate, burst, exp, issued, 0)
			case 5:
				ra, ea = sc.Reap(ctx, rdb, ka, c)
				rb, eb = sc.Reap(ctx, rdb, kb, c)
			}
			if ea != nil || eb != nil {
				rt.Fatalf("step %d: script error: %v, %v", step, ea, eb)
			}
			// The data set's generation counts the calls on both keys.
			if !reflect.DeepEqual(withoutGen(ra), withoutGen(rb)) {
				rt.Fatalf("step %d: read key's reply differs\n A: %+v\n B: %+v", step, ra, rb)
			}
			sameStored(ctx, rt, rdb, step, ka, kb)
		}
	})
}

// sameStored requires keys A and B to hold the same stored state.
func sameStored(ctx context.Context, t *rapid.T, rdb *redis.Client, step int, ka, kb Keys) {
	for _, p := range [][2]string{{ka.Bucket, kb.Bucket}} {
		a, b := rdb.HGetAll(ctx, p[0]).Val(), rdb.HGetAll(ctx, p[1]).Val()
		delete(a, "rl")
		delete(b, "rl")
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("step %d: read key's stored state differs\n %s: %v\n %s: %v", step, p[0], a, p[1], b)
		}
	}
	za := rdb.ZRangeWithScores(ctx, ka.Expiry, 0, -1).Val()
	zb := rdb.ZRangeWithScores(ctx, kb.Expiry, 0, -1).Val()
	if !reflect.DeepEqual(za, zb) {
		t.Fatalf("step %d: read key's expiry set differs\n A: %v\n B: %v", step, za, zb)
	}
	ca, erra := rdb.ZScore(ctx, ka.Cand, ka.Member).Result()
	cb, errb := rdb.ZScore(ctx, kb.Cand, kb.Member).Result()
	if ca != cb || (erra == nil) != (errb == nil) {
		t.Fatalf("step %d: read key's candidate score %v (%v), other %v (%v)", step, ca, erra, cb, errb)
	}
}

// checkReadTTL requires the keys read to carry the TTL a writing read sets:
// bucket_ttl at the read's instant (worked out here from the reply), on
// the bucket (its lease records with it) and on the expiry set when the
// key has one.
func checkReadTTL(ctx context.Context, t *rapid.T, rdb *redis.Client, k Keys, c Common, st State) {
	if rdb.Exists(ctx, k.Bucket).Val() == 0 {
		return
	}
	capmax, gleft := c.StaticBurst, 0.0
	if st.GrantExpiryUS > 0 {
		capmax = math.Max(capmax, st.Cap)
		gleft = math.Ceil(float64(st.GrantExpiryUS-st.NowUS) / 1000)
	}
	ms := gleft + math.Ceil(2000*capmax/c.StaticRate)
	ms = math.Max(ms, 2*float64(c.LeaseTTL.Milliseconds())) + 1000
	want := time.Duration(ms) * time.Millisecond
	names := []string{k.Bucket}
	if rdb.Exists(ctx, k.Expiry).Val() == 1 {
		names = append(names, k.Expiry)
	}
	for _, name := range names {
		got := rdb.PTTL(ctx, name).Val()
		if got > want || got < want-2*time.Second {
			t.Fatalf("%s after a state read at %s: PTTL %v, want %v", name, strconv.FormatInt(st.NowUS, 10), got, want)
		}
	}
}

// withoutGen is a script reply with its Gen field zeroed: two keys of one
// data set see its generation at different calls.
func withoutGen(r any) any {
	v := reflect.New(reflect.TypeOf(r)).Elem()
	v.Set(reflect.ValueOf(r))
	if f := v.FieldByName("Gen"); f.IsValid() {
		f.SetInt(0)
	}
	if f := v.FieldByName("Released"); f.IsValid() {
		f.SetFloat(0)
	}
	return v.Interface()
}
