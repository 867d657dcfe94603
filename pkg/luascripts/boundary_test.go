package luascripts

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestStampBornKeepsAWrittenSentinel: a sentinel holding a time is the data
// set's birth and is never written again: stamping it later, trusted full
// or not, answers the stored birth, writes nothing, and leaves the value.
func TestStampBornKeepsAWrittenSentinel(t *testing.T) {
	for _, tc := range []struct {
		name          string
		first, second bool // trustFull of the first and the second stamp
		wantBorn      func(t0 int64) int64
	}{
		{"dated, then trusted", false, true, func(t0 int64) int64 { return t0 }},
		{"dated, then dated", false, false, func(t0 int64) int64 { return t0 }},
		{"trusted, then dated", true, false, func(int64) int64 { return 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newTwin(t)
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
			t0 := w.now
			got, err := w.sc.StampBorn(w.ctx, w.rdb, []string{k.Born}, tc.first)
			if want := tc.wantBorn(t0); err != nil || len(got) != 1 || !got[0].Written || got[0].BornUS != want {
				t.Fatalf("first stamp: %+v, %v; want %d written", got, err, want)
			}
			w.at(t0 + 5_000_000)
			got, err = w.sc.StampBorn(w.ctx, w.rdb, []string{k.Born}, tc.second)
			if want := tc.wantBorn(t0); err != nil || len(got) != 1 || got[0].Written || got[0].BornUS != want {
				t.Fatalf("second stamp: %+v, %v; want the stored %d, not written", got, err, want)
			}
			if v := w.rdb.Get(w.ctx, k.Born).Val(); v != itoa(tc.wantBorn(t0)) {
				t.Fatalf("sentinel %q after the second stamp, want %d", v, tc.wantBorn(t0))
			}
		})
	}
}

// TestFirstMarkWindowOpensAtTimeZero: a key that never had a mark window
// counts its first one from Redis time 0, so at exactly one mark interval
// past 0 the window closes and a strict demand of exactly half the static
// share over it (10 tokens over 200ms: 50/s of 100/s) marks the key, and
// one microsecond before it the window is still open: nothing is marked
// or written for candidates.
func TestFirstMarkWindowOpensAtTimeZero(t *testing.T) {
	c := Common{StaticRate: 100, StaticBurst: 200, LeaseTTL: 5 * time.Second, ReapBudget: 8,
		DemandWindow: 500 * time.Millisecond, MarkEvery: 200 * time.Millisecond}
	for _, tc := range []struct {
		now    int64
		marked bool
	}{
		{200_000, true},
		{199_999, false},
	} {
		w := newTwin(t)
		k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
		w.at(tc.now)
		if r := w.check(k, c, 10); !r.Allowed {
			t.Fatalf("at %dµs: a check of 10 on a full bucket of 200 denied: %+v", tc.now, r)
		}
		got := w.cands(k.Cand)
		if _, ok := got[k.Member]; ok != tc.marked {
			t.Fatalf("at %dµs: candidates %v, want marked %v", tc.now, got, tc.marked)
		}
		if tc.marked && got[k.Member] != tc.now {
			t.Fatalf("at %dµs: marked until %d, want until now", tc.now, got[k.Member])
		}
		cw := w.rdb.HGet(w.ctx, k.Bucket, "cw").Val()
		if want := map[bool]string{true: itoa(tc.now), false: ""}[tc.marked]; cw != want {
			t.Fatalf("at %dµs: mark window start %q, want %q", tc.now, cw, want)
		}
	}
}

// TestNeverIsMinusOneOnTheWire: every way a wait can be "never" reaches the
// wire as exactly -1 (the scripts' reply contract), for a check and for a
// lease request alike: a cost above the cap, a rate of nothing, a wait
// beyond the largest one a clock holds, and a wait that fits until the
// restart wait still ahead is added to it.
func TestNeverIsMinusOneOnTheWire(t *testing.T) {
	slow := Common{StaticRate: 1e-9, StaticBurst: 100, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	for _, tc := range []struct {
		name string
		c    Common
		prep func(w *twin, k Keys, c Common)
		cost int64
	}{
		{"cost above the cap", Common{StaticRate: 1, StaticBurst: 0.5, LeaseTTL: time.Second, ReapBudget: 8,
			DemandWindow: time.Millisecond}, func(*twin, Keys, Common) {}, 1},
		{"a granted rate of nothing", Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8,
			DemandWindow: time.Millisecond}, func(w *twin, k Keys, c Common) {
			w.setRate(k, c, 0, 10, w.now+1_000_000_000, w.now)
			w.check(k, c, 10)
		}, 1},
		// Created at Redis time 1.8e15µs, refilled from 0: 1.8 tokens.
		{"a wait beyond any clock", slow, func(*twin, Keys, Common) {}, 100},
		{"a wait beyond any clock after the restart wait", func() Common {
			c := slow
			c.RestartWait = 800_000_000_000 * time.Millisecond
			return c
		}(), func(*twin, Keys, Common) {}, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newTwin(t)
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
			tc.prep(w, k, tc.c)
			res, err := w.sc.check.Run(w.ctx, w.rdb, k.list(), w.sc.args(k, tc.c, tc.cost)...).Slice()
			if err != nil || len(res) != 8 || res[0] != int64(0) || res[2] != int64(-1) {
				t.Fatalf("check of %d: reply %v, %v; want denied with retry -1", tc.cost, res, err)
			}
			r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: tc.cost, Min: tc.cost}
			res, err = w.sc.acquire.Run(w.ctx, w.rdb, k.list(), w.sc.args(k, tc.c, r.opArgs()...)...).Slice()
			if err != nil || len(res) != 12 || res[0] != int64(0) || res[3] != int64(-1) {
				t.Fatalf("lease of %d: reply %v, %v; want nothing granted, retry -1", tc.cost, res, err)
			}
		})
	}
}
