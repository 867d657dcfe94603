package luascripts

import (
	"context"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Values the fuzz target draws from: the extremes the edges accept next to
// ordinary ones.
var (
	fuzzRates      = []float64{3e-9, 0.151, 1, 1.0 / 3, 66.666666666, 0.7, 1e6, quota.MaxRate}
	fuzzBursts     = []float64{0, 0.5, 1 - 1e-12, 1, 7, 1000, quota.MaxBurst}
	fuzzGrantRates = []float64{0, 5e-324, 1e-10, 0.25, 1.0 / 3, 40, quota.MaxRate}
	fuzzGrantCaps  = []float64{0, 2.0 / 3, 1, 100, quota.MaxBurst}
	fuzzDeposits   = []float64{0, 0, 1, 2.5, 1.0 / 3, 1e-7, 100}
	fuzzSteps      = []int64{0, 1, 10, 999, 50_000, 1_000_000, -1, -1_000_000, 3_600_000_000, 31_536_000_000_000}
	fuzzCosts      = []int64{1, 2, 7, 1000, quota.MaxCost}
	fuzzWants      = []int64{0, 1, 5, 300, quota.MaxWant}
)

// fuzzInput reads a fuzz input as a stream of small choices; a drained
// input reads as zeros.
type fuzzInput struct {
	b []byte
	i int
}

func (in *fuzzInput) next() int {
	if in.i >= len(in.b) {
		return 0
	}
	in.i++
	return int(in.b[in.i-1])
}

func (in *fuzzInput) done() bool     { return in.i >= len(in.b) }
func (in *fuzzInput) pick(n int) int { return in.next() % n }

func pickOf[T any](in *fuzzInput, xs []T) T { return xs[in.pick(len(xs))] }

// FuzzScriptsMatchModel runs random operation sequences on one key through
// the Lua scripts on a real redis-server and through Model, on a virtual
// Redis clock that also jumps back, and requires after every step:
// identical replies, identical stored state and TTLs; tk ≤ max(0, cap −
// out) (to the storage's half micro-token at a cap off the micro-token
// grid); and conformance in exact arithmetic: the region's holdings (tk +
// out) never exceed a shadow bucket that refills at exactly the rate in
// force (granted while valid, static after) up to the cap and loses what
// each operation consumed, so what the key admits never exceeds
// b + ∫ rate dt.
func FuzzScriptsMatchModel(f *testing.F) { fuzzScripts(f, nil) }

// FuzzScriptsAcrossARise is FuzzScriptsMatchModel with the key handed a
// rise (lib.lua, "Coming back from a floor"): before, at or after the
// start, or after another node's clock, from a floor of none, a part or
// more than the share (taken at the share). The same checks hold: the
// rise only ever credits less than the shadow's static refill.
func FuzzScriptsAcrossARise(f *testing.F) {
	fuzzScripts(f, func(in *fuzzInput, c *Common, now int64) {
		c.RiseUS = now + pickOf(in, []int64{-3_600_000_000, -1_000_000, -1, 0, 1, 500_000, 5_000_000, 60_000_000})
		frac := pickOf(in, []float64{0, 0.25, 0.5, 1, 3})
		c.FloorRate, c.FloorBurst = c.StaticRate*frac, math.Floor(c.StaticBurst*frac)
	})
}

// fuzzScripts runs a fuzz target of the scripts against Model on one
// redis-server: each input's settings (fuzzCommon), changed by more when
// given, then its operations (runFuzzOps).
func fuzzScripts(f *testing.F, more func(in *fuzzInput, c *Common, now int64)) {
	srv := redistest.Start(f)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := rdb.FlushDB(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		sc.forgetGenerations()
		in := &fuzzInput{b: data}
		c, now, born := fuzzCommon(in)
		if more != nil {
			more(in, &c, now)
		}
		runFuzzOps(t, ctx, rdb, sc, c, now, born, in)
	})
}

// fuzzCommon reads the key's settings, the start and the data set's birth
// (-1: no sentinel) from the input.
func fuzzCommon(in *fuzzInput) (Common, int64, int64) {
	c := Common{
		StaticRate: pickOf(in, fuzzRates), StaticBurst: pickOf(in, fuzzBursts),
		LeaseTTL: time.Duration(1+in.pick(5)) * time.Second, Reclaim: in.pick(2) == 0,
		ReapBudget: in.pick(4), DemandWindow: 500 * time.Millisecond,
		MarkEvery: 250 * time.Millisecond, // marking on, the input's reading unchanged
	}
	now := int64(1_700_000_000_000_000)
	born := int64(-1) // no sentinel
	switch in.pick(4) {
	case 0: // a data set born a while ago (Redis lost its data)
		c.RestartWait = c.LeaseTTL
		born = now - int64(in.next())*100_000
	case 1: // guarded, no sentinel yet: the scripts date the data set
		c.RestartWait = c.LeaseTTL
	}
	if c.StaticBurst == 0 {
		// A cap of 0 is a floor or a share awaited: held calls must
		// never let the region hold more than the shadow either. Its
		// rate is 0 too on a floor of 0 (drained, off the static
		// lease at partition_share 0) and while a class is not known
		// yet; the share's fill time is known to the regional service
		// (keys live twice it), not to tools (2 x lease TTL). One
		// choice, read as before for the share awaited.
		v := in.pick(8)
		c.AwaitingShare = v%2 == 0
		if v&2 != 0 {
			c.StaticRate = 0
		}
		if v&4 != 0 {
			c.ShareFill = 7 * time.Second
		}
	}
	return c, now, born
}

// half is the storage's resolution at a cap: half a micro-token.
var half = big.NewRat(1, 2_000_000)

func ratF(x float64) *big.Rat { return new(big.Rat).SetFloat64(x) }

func ratS(t *testing.T, s string) *big.Rat {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		t.Fatalf("stored number %q", s)
	}
	return r
}

func minRat(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) <= 0 {
		return a
	}
	return new(big.Rat).Set(b)
}

func maxRat(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) >= 0 {
		return a
	}
	return new(big.Rat).Set(b)
}

// credit is r tokens/s over dt µs, exactly.
func creditRat(r float64, dt int64) *big.Rat {
	x := ratF(r)
	return x.Mul(x, new(big.Rat).SetFrac64(dt, 1_000_000))
}

func runFuzzOps(t *testing.T, ctx context.Context, rdb *redis.Client, sc *Scripts, c Common, now, born int64, in *fuzzInput) {
	if err := c.Validate(); err != nil {
		t.Fatalf("fuzz config: %v", err)
	}
	m := NewModel()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "fz", Class: "read"})
	if born >= 0 {
		m.StampBorn(born, k.Born, false)
		sc.setNow(born)
		if _, err := sc.StampBorn(ctx, rdb, []string{k.Born}, false); err != nil {
			t.Fatal(err)
		}
	}
	type view struct {
		seq, used, denied, returned int64
		last                        Report
	}
	views := map[string]*view{}

	var shadow *big.Rat // exact holdings bound; nil until the key exists
	var shadowT int64   // the shadow's refill time (latest Redis time seen)
	prev := map[string]string{}
	for step := 0; step < 64 && !in.done(); step++ {
		now += pickOf(in, fuzzSteps)
		if gone := m.ExpireDue(now); len(gone) > 0 {
			if err := rdb.Del(ctx, gone...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		mb, existed := m.buckets[k.Bucket]
		existed = existed && !mb.held // a held key's demand alone is no bucket
		sc.setNow(now)
		inst := "i-" + strconv.Itoa(in.pick(fewLeases+3)) // both ways of reaping (see fewLeases)
		v := views[inst]
		if v == nil {
			v = &view{}
			views[inst] = v
		}
		report := func(withReturn bool) Report {
			if v.seq > 0 && in.pick(5) == 0 {
				return v.last // a retry
			}
			v.seq++
			v.used += int64(in.next())
			v.denied += int64(in.pick(8))
			if withReturn {
				v.returned += int64(in.pick(16))
			}
			v.last = Report{Instance: inst, Seq: uint64(v.seq), Used: v.used, Denied: v.denied, Returned: v.returned,
				Want: pickOf(in, fuzzWants), Min: int64(in.pick(4))}
			if v.last.Min > v.last.Want {
				v.last.Min = v.last.Want
			}
			return v.last
		}
		var got, want any
		var err error
		var what string
		var deposit float64 // set_rate's: tokens moved in from other regions
		switch opn := in.pick(7); opn {
		case 0:
			what = "acquire"
			r := report(false)
			want = m.Acquire(now, k, c, r)
			got, err = sc.Acquire(ctx, rdb, k, c, r)
		case 1:
			what = "sync"
			r := report(true)
			want = m.Sync(now, k, c, r)
			got, err = sc.Sync(ctx, rdb, k, c, r)
		case 2:
			what = "release"
			r := report(true)
			want = m.Release(now, k, c, r)
			got, err = sc.Release(ctx, rdb, k, c, r)
			delete(views, inst)
		case 3:
			what = "check"
			cost := pickOf(in, fuzzCosts)
			want = m.Check(now, k, c, cost)
			got, err = sc.Check(ctx, rdb, k, c, cost)
		case 4:
			what = "reap"
			want = m.Reap(now, k, c)
			got, err = sc.Reap(ctx, rdb, k, c)
		case 5:
			what = "set_rate"
			rate, burst := pickOf(in, fuzzGrantRates), pickOf(in, fuzzGrantCaps)
			exp := now + int64(in.next()-64)*100_000
			issued := now - int64(in.pick(64))*100_000
			deposit = pickOf(in, fuzzDeposits)
			want = m.SetRate(now, k, c, rate, burst, exp, issued, deposit)
			got, err = sc.SetRate(ctx, rdb, k, c, rate, burst, exp, issued, deposit)
		case 6:
			what = "state"
			want = m.State(now, k, c)
			got, err = sc.State(ctx, rdb, k, c)
		}
		where := fmt.Sprintf("step %d (%s at %+dµs)", step, what, now-1_700_000_000_000_000)
		if err != nil {
			t.Fatalf("%s: script error: %v", where, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: reply differs\n lua:   %+v\n model: %+v", where, got, want)
		}
		state := snapshot(ctx, t, rdb)
		if ms := m.Snapshot(); !reflect.DeepEqual(state, ms) {
			t.Fatalf("%s: state differs\n redis: %v\n model: %v", where, state, ms)
		}
		for name := range state {
			if name == k.Born || name == k.Cand || name == k.Gen {
				if got := rdb.PTTL(ctx, name).Val(); got != -1 {
					t.Fatalf("%s: %s PTTL %v, want none", where, name, got)
				}
				continue
			}
			wantTTL, _ := m.LastTTL(name)
			gotTTL, err := rdb.PTTL(ctx, name).Result()
			if err != nil || gotTTL <= 0 || gotTTL > wantTTL || gotTTL < wantTTL-2*time.Second {
				t.Fatalf("%s: %s PTTL %v (%v), model says %v", where, name, gotTTL, err, wantTTL)
			}
		}
		b, ok := state[k.Bucket]
		if ok && b["ts"] == "" {
			// A held key's demand alone (lib.lua, "Awaited share"): no
			// bucket, and nothing else of the key may exist.
			if !c.AwaitingShare || existed {
				t.Fatalf("%s: a hash without ts %v (awaiting %v, bucket before %v)", where, b, c.AwaitingShare, existed)
			}
			if _, ok := state[k.Expiry]; ok || len(recordsOf(b)) > 0 || b["n"] != "" {
				t.Fatalf("%s: a held key has lease records", where)
			}
			ok = false
		}
		if !ok {
			// A call that can only undo (a release, a reap, a report of an
			// unknown lease asking for nothing) on a key with no bucket
			// created none.
			if existed {
				t.Fatalf("%s: the bucket vanished", where)
			}
			continue
		}

		// tk ≤ max(0, cap(now) − out), to half a micro-token. A state
		// read that left the stored bucket as it was writes nothing: the
		// stored bucket is as of the call that wrote it, under that call's
		// cap (a grant's that may have ended since; the next writing call
		// clamps to the cap then), so the tokens and leases the read
		// answered stand for the bucket now, here and in the checks below.
		tk, out := ratS(t, bucketField(b, "t")), ratS(t, bucketField(b, "out"))
		if st, ok := got.(State); ok && existed && reflect.DeepEqual(b, prev) {
			tk, out = ratF(st.Tokens), new(big.Rat).SetInt64(st.Outstanding)
		}
		capNow := ratF(c.StaticBurst)
		if ge, _ := strconv.ParseInt(b["ge"], 10, 64); ge > now {
			capNow = ratS(t, bucketField(b, "gb"))
		}
		room := maxRat(new(big.Rat), new(big.Rat).Sub(capNow, out))
		if tk.Cmp(new(big.Rat).Add(room, half)) > 0 {
			t.Fatalf("%s: tk %s above max(0, cap %s − out %s)", where, bucketField(b, "t"), capNow.FloatString(9), bucketField(b, "out"))
		}

		// A state read that left the stored bucket as it was consumed
		// nothing and moved no refill time: the shadow stays as it was
		// too (the next call refills both from before the read).
		keptShadow, keptT := shadow, shadowT
		if shadow != nil {
			keptShadow = new(big.Rat).Set(shadow)
		}
		unchanged := what == "state" && existed && reflect.DeepEqual(b, prev)

		// The shadow bucket, refilled exactly over [shadowT, now] by the
		// grant stored before this step, then at the static rate.
		outBefore := new(big.Rat)
		if !existed {
			if shadow == nil {
				// A first bucket: empty since born + lease TTL, refilled
				// at the static rate up to the static cap.
				shadow = ratF(c.StaticBurst)
				shadowT = now
				if c.RestartWait > 0 {
					bornUS, ok := m.BornOf(k.Born)
					if !ok {
						t.Fatalf("%s: a bucket was created and the data set has no born sentinel", where)
					}
					shadow = new(big.Rat)
					shadowT = bornUS + c.RestartWait.Microseconds()
				}
				if shadowT > now {
					shadowT = now
				}
			}
			// A bucket that expired: its leases' unspent tokens went with
			// it (they had all expired).
			if o, ok := prev["out"]; ok {
				shadow.Sub(shadow, ratS(t, o))
			}
			prev = map[string]string{"gr": "0", "gb": "0", "ge": "0", "out": "0"}
		} else {
			outBefore = ratS(t, bucketField(prev, "out"))
		}
		if now > shadowT {
			ts := shadowT
			if ge, _ := strconv.ParseInt(prev["ge"], 10, 64); ge > ts {
				e := min(ge, now)
				gr, _ := strconv.ParseFloat(prev["gr"], 64)
				shadow.Add(shadow, creditRat(gr, e-ts))
				shadow = minRat(shadow, maxRat(new(big.Rat).Set(outBefore), ratS(t, bucketField(prev, "gb"))))
				ts = e
			}
			if now > ts {
				shadow.Add(shadow, creditRat(c.StaticRate, now-ts))
			}
			shadowT = now
		}
		capBefore := ratF(c.StaticBurst)
		if ge, _ := strconv.ParseInt(prev["ge"], 10, 64); ge > now {
			capBefore = ratS(t, bucketField(prev, "gb"))
		}
		shadow = minRat(shadow, maxRat(new(big.Rat).Set(outBefore), capBefore))
		held := new(big.Rat).Add(ratF(m.refilled), outBefore)
		if held.Cmp(new(big.Rat).Add(shadow, half)) > 0 {
			t.Fatalf("%s: refill made the region hold %s tokens where b + ∫ rate dt allows %s",
				where, held.FloatString(9), shadow.FloatString(9))
		}
		// Only a grant's deposit adds tokens, and at most its own: they
		// move in from other regions' buckets (the burst transfer). The
		// shadow takes them in below (held - after is negative).
		after := new(big.Rat).Add(tk, out)
		if after.Cmp(new(big.Rat).Add(new(big.Rat).Add(held, half), ratF(deposit))) > 0 {
			t.Fatalf("%s: the operation created tokens: holdings %s after refill, %s after (deposit %v)", where, held.FloatString(9), after.FloatString(9), deposit)
		}
		shadow.Sub(shadow, new(big.Rat).Sub(held, after))
		if unchanged {
			shadow, shadowT = keptShadow, keptT
		}
		prev = b
	}
}
