package luascripts

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLuaMatchesModel drives random operation sequences through the Lua
// scripts on a real redis-server and through Model, at the same instants,
// and requires identical replies and identical stored state after every
// step. Time is virtual on both sides: the scripts under test are built with
// a clock that reads now from their last argument (the one line that
// differs from production), and key expiry is applied by the harness at
// virtual instants, as the Model says Redis would.
func TestLuaMatchesModel(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()

	rapid.Check(t, func(rt *rapid.T) {
		if err := rdb.FlushDB(ctx).Err(); err != nil {
			rt.Fatalf("flushdb: %v", err)
		}
		sc.forgetGenerations()
		m := NewModel()
		now := int64(1_700_000_000_000_000) + rapid.Int64Range(0, 1e9).Draw(rt, "start")

		nKeys := rapid.IntRange(1, 3).Draw(rt, "keys")
		type keyCase struct {
			keys Keys
			c    Common
		}
		kcs := make([]keyCase, nKeys)
		for i := range kcs {
			c := Common{
				StaticRate:   rapid.SampledFrom([]float64{0.1, 0.5, 1, 3, 10, 66.666666666, 1000}).Draw(rt, "rate"),
				StaticBurst:  rapid.SampledFrom([]float64{0, 0.5, 1, 5, 20, 200}).Draw(rt, "burst"),
				LeaseTTL:     time.Duration(rapid.IntRange(1000, 5000).Draw(rt, "ttl_ms")) * time.Millisecond,
				Reclaim:      rapid.Bool().Draw(rt, "reclaim"),
				ReapBudget:   rapid.IntRange(0, 3).Draw(rt, "reap"),
				DemandWindow: time.Duration(rapid.SampledFrom([]int{1, 300, 500}).Draw(rt, "demand_window_ms")) * time.Millisecond,
				MarkEvery:    time.Duration(rapid.SampledFrom([]int{0, 1, 250, 2000}).Draw(rt, "mark_every_ms")) * time.Millisecond,
			}
			if c.StaticBurst == 0 {
				c.AwaitingShare = rapid.Bool().Draw(rt, "awaiting")
				// A floor of 0, or a class not known yet: no rate either.
				if rapid.Bool().Draw(rt, "zero_rate") {
					c.StaticRate = 0
				}
				c.ShareFill = time.Duration(rapid.SampledFrom([]int{0, 1, 2500, 3_600_000}).Draw(rt, "share_fill_ms")) * time.Millisecond
			}
			if rapid.Bool().Draw(rt, "guarded") {
				c.RestartWait = time.Duration(rapid.IntRange(1, 10_000).Draw(rt, "restart_wait_ms")) * time.Millisecond
			}
			k := quota.Key{Tenant: "t" + strconv.Itoa(i), Class: "read"}
			ks := KeysFor(DefaultPrefix, k)
			if rapid.Bool().Draw(rt, "cluster_keys") {
				ks = ClusterKeysFor(DefaultPrefix, k)
			}
			kcs[i] = keyCase{ks, c}
		}
		// The data set's birth: missing (the scripts date it), long ago
		// or recent (a Redis that lost its data), or trusted full.
		stamp := func() {
			switch rapid.IntRange(0, 3).Draw(rt, "born") {
			case 1:
				born := now - rapid.Int64Range(0, 10e6).Draw(rt, "born_ago")
				for _, kc := range kcs {
					sc.setNow(born)
					m.StampBorn(born, kc.keys.Born, false)
					if _, err := sc.StampBorn(ctx, rdb, []string{kc.keys.Born}, false); err != nil {
						rt.Fatalf("stamp: %v", err)
					}
				}
			case 2:
				for _, kc := range kcs {
					m.StampBorn(now, kc.keys.Born, true)
					if _, err := sc.StampBorn(ctx, rdb, []string{kc.keys.Born}, true); err != nil {
						rt.Fatalf("stamp: %v", err)
					}
				}
			}
		}
		stamp()
		// More instances than a key keeps without an expiry set
		// (fewLeases), so both ways of reaping run.
		instances := []string{"i-a", "i-b", "i-c", "i-d", "i-e", "i-f", "i-g"}
		// Per (instance, key): the instance's own view of its lease, as a
		// client keeps it (cumulative totals, lease number), and its last
		// report for retries.
		type view struct {
			seq, lease             uint64
			used, denied, returned int64
		}
		views := map[string]*view{}
		last := map[string]Report{}

		// A snapshot of both sides (op 9) that a later op 9 may restore.
		var saved *rollbackPoint

		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for step := 0; step < steps; step++ {
			now += rapid.SampledFrom([]int64{0, 1, 999, 50_000, 333_333, 1_000_000, 4_000_000, 30_000_000}).Draw(rt, "dt")
			if gone := m.ExpireDue(now); len(gone) > 0 {
				if err := rdb.Del(ctx, gone...).Err(); err != nil {
					rt.Fatalf("del: %v", err)
				}
			}
			sc.setNow(now)
			ki := rapid.IntRange(0, nKeys-1).Draw(rt, "key")
			if rapid.IntRange(0, 5).Draw(rt, "rises") == 0 {
				// The region came back from a floor (lib.lua, "Coming
				// back from a floor"): at, before or (another node's
				// clock) just after now; a floor above the share is
				// taken at the share.
				c := &kcs[ki].c
				c.RiseUS = now - rapid.SampledFrom([]int64{-1_000_000, 0, 1, 500_000, 4_000_000, 60_000_000}).Draw(rt, "rise_ago")
				frac := rapid.SampledFrom([]float64{0, 0.25, 1, 2}).Draw(rt, "floor_share")
				c.FloorRate, c.FloorBurst = c.StaticRate*frac, math.Floor(c.StaticBurst*frac)
			}
			kc := kcs[ki]
			inst := rapid.SampledFrom(instances).Draw(rt, "instance")
			lk := inst + kc.keys.Bucket
			report := func(withReturn bool) Report {
				switch rapid.IntRange(0, 9).Draw(rt, "kind") {
				case 0, 1:
					if r, ok := last[lk]; ok {
						return r // a retried message: same seq, same numbers
					}
				case 2:
					if r, ok := last[lk]; ok && r.Seq > 1 {
						r.Seq-- // a stale or conflicting message
						return r
					}
				case 3:
					if r, ok := last[lk]; ok {
						// another process under the same id, or one that
						// went back in its totals
						if rapid.Bool().Draw(rt, "other_incarnation") {
							r.Incarnation++
						} else {
							r.Used = max(0, r.Used-1)
						}
						r.Seq++
						return r
					}
				}
				v := views[lk]
				if v == nil {
					v = &view{}
					views[lk] = v
				}
				v.seq++
				if v.lease == 0 || rapid.IntRange(0, 9).Draw(rt, "new_lease") == 0 {
					v.lease, v.used, v.denied, v.returned = v.seq, 0, 0, 0
				}
				v.used += rapid.Int64Range(0, 300).Draw(rt, "used")
				v.denied += rapid.Int64Range(0, 50).Draw(rt, "denied")
				if withReturn {
					v.returned += rapid.Int64Range(0, 100).Draw(rt, "returned")
				}
				r := Report{
					Instance: inst, Incarnation: 1 << 63, Lease: v.lease, Seq: v.seq,
					Used: v.used, Denied: v.denied, Returned: v.returned,
					Want: rapid.Int64Range(0, 300).Draw(rt, "want"),
					Min:  rapid.Int64Range(0, 20).Draw(rt, "min"),
				}
				if rapid.IntRange(0, 5).Draw(rt, "book_only") == 0 {
					r.BookOnly, r.Want, r.Min = true, 0, 0
				}
				last[lk] = r
				return r
			}

			// The call's deadline: none, not yet reached (at most at
			// now: a call at its deadline still acts), or past (the call
			// changes nothing and answers too late).
			var dl int64
			switch rapid.IntRange(0, 3).Draw(rt, "deadline") {
			case 1:
				dl = now + rapid.SampledFrom([]int64{0, 1, 1_000_000}).Draw(rt, "deadline_ahead")
			case 2:
				dl = now - rapid.SampledFrom([]int64{1, 1_000_000}).Draw(rt, "deadline_behind")
			}
			withDL := func(c Common) Common {
				c.DeadlineUS = dl
				return c
			}
			var got, want any
			var err error
			switch opn := rapid.IntRange(0, 10).Draw(rt, "op"); opn {
			case 10:
				// The share a key awaited arrives (its config confirmed):
				// a held key is born at its cap from the next call on.
				dl = 0 // no script runs
				if kc.c.AwaitingShare {
					kcs[ki].c.StaticBurst = rapid.SampledFrom([]float64{1, 5, 20}).Draw(rt, "share")
					kcs[ki].c.AwaitingShare = false
				}
				got, want = 0, 0
			case 8:
				// The region leader trims the candidate set.
				dl = 0 // no script runs
				below := now - rapid.Int64Range(0, 10e6).Draw(rt, "trim_ago")
				m.TrimCandidates(kc.keys.Cand, below)
				if err := rdb.ZRemRangeByScore(ctx, kc.keys.Cand, "-inf", "("+strconv.FormatInt(below, 10)).Err(); err != nil {
					rt.Fatalf("trim: %v", err)
				}
				got, want = 0, 0
			case 9:
				// Redis goes back in time: restored from a snapshot taken
				// earlier, or a lagging replica promoted; the instances and
				// the process keep their views.
				dl = 0 // no script runs
				if saved == nil || rapid.Bool().Draw(rt, "save") {
					saved = takeRollbackPoint(ctx, rt, rdb, m)
				} else {
					m = saved.restore(ctx, rt, rdb, m.Generations())
				}
				got, want = 0, 0
			case 7:
				// Redis restarts empty: every key and sentinel is gone
				// while the instances keep their views.
				dl = 0 // no script runs
				if err := rdb.FlushDB(ctx).Err(); err != nil {
					rt.Fatalf("flushdb: %v", err)
				}
				m = NewModelSeen(m.Generations())
				stamp()
				got, want = 0, 0
			case 0:
				r := report(false)
				want = m.Acquire(now, kc.keys, withDL(kc.c), r)
				got, err = sc.Acquire(ctx, rdb, kc.keys, withDL(kc.c), r)
			case 1:
				r := report(true)
				want = m.Sync(now, kc.keys, withDL(kc.c), r)
				got, err = sc.Sync(ctx, rdb, kc.keys, withDL(kc.c), r)
			case 2:
				r := report(true)
				want = m.Release(now, kc.keys, withDL(kc.c), r)
				got, err = sc.Release(ctx, rdb, kc.keys, withDL(kc.c), r)
			case 3:
				cost := rapid.Int64Range(1, 30).Draw(rt, "cost")
				want = m.Check(now, kc.keys, withDL(kc.c), cost)
				got, err = sc.Check(ctx, rdb, kc.keys, withDL(kc.c), cost)
			case 4:
				want = m.Reap(now, kc.keys, withDL(kc.c))
				got, err = sc.Reap(ctx, rdb, kc.keys, withDL(kc.c))
			case 5:
				rate := rapid.SampledFrom([]float64{0, 0.25, 2, 40, 500.5, 399.99999999999994, 1.0 / 3, 5e-324, 1e-7, 1e-10}).Draw(rt, "grant_rate")
				burst := rapid.SampledFrom([]float64{0, 1, 7.5, 100, 2.0 / 3}).Draw(rt, "grant_burst")
				exp := now + rapid.Int64Range(-2e6, 10e6).Draw(rt, "grant_valid")
				issued := now - rapid.Int64Range(0, 3e6).Draw(rt, "issued_ago")
				deposit := rapid.SampledFrom([]float64{0, 0, 1, 2.5, 100, 1e-7, 1.0 / 3}).Draw(rt, "deposit")
				if rapid.Bool().Draw(rt, "batched") {
					// The leader's batch: the grant on every key, in
					// one call per slot, as one call per key would.
					var items []SetRateItem
					var ws, gs []any
					for _, kc := range kcs {
						ws = append(ws, m.SetRate(now, kc.keys, withDL(kc.c), rate, burst, exp, issued, deposit))
						items = append(items, SetRateItem{Keys: kc.keys, Common: withDL(kc.c), Rate: rate, Burst: burst, ExpiryUS: exp, IssuedUS: issued, Deposit: deposit})
					}
					for _, r := range sc.SetRateMany(ctx, rdb, items) {
						gs = append(gs, r.Reply)
						if r.Err != nil && err == nil {
							err = r.Err
						}
					}
					got, want = gs, ws
					break
				}
				want = m.SetRate(now, kc.keys, withDL(kc.c), rate, burst, exp, issued, deposit)
				got, err = sc.SetRate(ctx, rdb, kc.keys, withDL(kc.c), rate, burst, exp, issued, deposit)
			case 6:
				if rapid.Bool().Draw(rt, "batched") {
					var items []KeyCommon
					var ws, gs []any
					for _, kc := range kcs {
						ws = append(ws, m.State(now, kc.keys, withDL(kc.c)))
						items = append(items, KeyCommon{Keys: kc.keys, Common: withDL(kc.c)})
					}
					for _, r := range sc.StateMany(ctx, rdb, items) {
						gs = append(gs, r.State)
						if r.Err != nil && err == nil {
							err = r.Err
						}
					}
					got, want = gs, ws
					break
				}
				want = m.State(now, kc.keys, withDL(kc.c))
				got, err = sc.State(ctx, rdb, kc.keys, withDL(kc.c))
			}
			if late := dl > 0 && now > dl; late != errors.Is(err, ErrTooLate) {
				rt.Fatalf("step %d: at %d with deadline %d: error %v", step, now, dl, err)
			}
			if err != nil && !errors.Is(err, ErrTooLate) {
				rt.Fatalf("step %d: script error: %v", step, err)
			}
			if !reflect.DeepEqual(got, want) {
				rt.Fatalf("step %d: reply differs\n lua:   %+v\n model: %+v", step, got, want)
			}
			redisState := snapshot(ctx, rt, rdb)
			if ms := m.Snapshot(); !reflect.DeepEqual(redisState, ms) {
				rt.Fatalf("step %d: state differs\n redis: %v\n model: %v", step, redisState, ms)
			}
			checkTTLs(ctx, rt, rdb, m)
		}
	})
}

// fataler is what snapshot needs of a test: both *testing.T and *rapid.T.
type fataler interface {
	Fatalf(format string, args ...any)
}

// snapshot renders every key in Redis as the Model's Snapshot does.
func snapshot(ctx context.Context, t fataler, rdb *redis.Client) map[string]map[string]string {
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatalf("keys: %v", err)
	}
	out := map[string]map[string]string{}
	for _, k := range keys {
		typ := rdb.Type(ctx, k).Val()
		switch typ {
		case "hash":
			out[k] = rdb.HGetAll(ctx, k).Val()
		case "zset":
			z := map[string]string{}
			for _, m := range rdb.ZRangeWithScores(ctx, k, 0, -1).Val() {
				z[m.Member.(string)] = strconv.FormatFloat(m.Score, 'f', 0, 64)
			}
			out[k] = z
		case "string":
			out[k] = map[string]string{"": rdb.Get(ctx, k).Val()}
		default:
			t.Fatalf("unexpected key %s of type %s", k, typ)
		}
	}
	return out
}

// checkTTLs requires every key to carry the TTL the model's last write set
// (PTTL counts down in real time, so allow the real time a run takes).
func checkTTLs(ctx context.Context, t *rapid.T, rdb *redis.Client, m *Model) {
	for name := range m.Snapshot() {
		if _, ok := m.BornOf(name); ok || strings.HasSuffix(name, "cand") || strings.HasSuffix(name, ":gen") {
			if got := rdb.PTTL(ctx, name).Val(); got != -1 {
				t.Fatalf("born sentinel or candidate set %s has PTTL %v, want none", name, got)
			}
			continue
		}
		want, ok := m.LastTTL(name)
		if !ok {
			t.Fatalf("model has no TTL for %s", name)
		}
		got, err := rdb.PTTL(ctx, name).Result()
		if err != nil {
			t.Fatalf("pttl %s: %v", name, err)
		}
		if got < 0 || got > want || got < want-2*time.Second {
			t.Fatalf("%s: PTTL %v, model says %v", name, got, want)
		}
	}
}

func TestKeysShareHashTag(t *testing.T) {
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "write"})
	for _, name := range []string{k.Bucket, k.Leases, k.Expiry} {
		if got := fmt.Sprint(name[len(DefaultPrefix) : len(DefaultPrefix)+len("{acme|write}")]); got != "{acme|write}" {
			t.Errorf("%s does not start with the hash tag {acme|write}", name)
		}
	}
}

// TestBornKeysShareTheirSlot: on a cluster every key a script touches,
// the born sentinel included, hashes to the quota key's slot, as real
// Redis computes slots (CLUSTER KEYSLOT), and every slot has its own
// sentinel.
func TestBornKeysShareTheirSlot(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := context.Background()
	for _, s := range []string{"foo", "acme|write", "born-0"} {
		if want := rdb.Do(ctx, "CLUSTER", "KEYSLOT", s).Val(); want != nil && int64(Slot(s)) != want.(int64) {
			t.Fatalf("Slot(%q) = %d, redis says %v", s, Slot(s), want)
		}
	}
	if Slot("foo") != 12182 {
		t.Fatalf("Slot(foo) = %d, want 12182", Slot("foo"))
	}
	for i := range 50 {
		k := ClusterKeysFor(DefaultPrefix, quota.Key{Tenant: "t" + strconv.Itoa(i*7919), Class: "write"})
		want := Slot(k.Bucket[len(DefaultPrefix)+1 : strings.Index(k.Bucket, "}")])
		born := k.Born[strings.Index(k.Born, "{")+1 : strings.Index(k.Born, "}")]
		if Slot(born) != want {
			t.Fatalf("%s hashes to slot %d, its keys to %d", k.Born, Slot(born), want)
		}
	}
	all := BornKeys(DefaultPrefix, true)
	seen := map[string]bool{}
	for s, name := range all {
		if seen[name] {
			t.Fatalf("slot %d shares its sentinel %s", s, name)
		}
		seen[name] = true
	}
	if one := BornKeys(DefaultPrefix, false); len(one) != 1 || one[0] != KeysFor(DefaultPrefix, quota.Key{Tenant: "a", Class: "b"}).Born {
		t.Fatalf("single Redis sentinels %v", one)
	}
}

// rollbackPoint is a snapshot of a real Redis and of the Model driven
// through the same operations.
type rollbackPoint struct {
	model *Model
	dumps map[string]string        // key -> DUMP
	ttls  map[string]time.Duration // key -> PTTL at the snapshot (-1: none)
}

func takeRollbackPoint(ctx context.Context, t fataler, rdb *redis.Client, m *Model) *rollbackPoint {
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatalf("keys: %v", err)
	}
	p := &rollbackPoint{model: m.rolledBack(m.Generations()), dumps: map[string]string{}, ttls: map[string]time.Duration{}}
	for _, k := range keys {
		p.dumps[k] = rdb.Dump(ctx, k).Val()
		p.ttls[k] = rdb.PTTL(ctx, k).Val()
	}
	return p
}

// restore puts Redis back to the snapshot and returns the Model as it was
// then, called by a process whose view is g.
func (p *rollbackPoint) restore(ctx context.Context, t fataler, rdb *redis.Client, g *Generations) *Model {
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatalf("flushdb: %v", err)
	}
	for k, d := range p.dumps {
		ttl := p.ttls[k]
		if ttl < 0 {
			ttl = 0
		}
		if err := rdb.Restore(ctx, k, ttl, d).Err(); err != nil {
			t.Fatalf("restore %s: %v", k, err)
		}
	}
	return p.model.rolledBack(g)
}
