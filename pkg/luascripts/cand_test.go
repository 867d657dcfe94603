package luascripts

import (
	"context"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestScriptsMarkCandidates follows the candidate set on a real
// redis-server and in the Model: a key whose demand stays under half its
// static share is never marked; a lease demand or a strict-path rate that
// reaches half is, with the time of the reading; a grant marks the key
// until its expiry, and a later demand mark never shortens that; marks are
// read at most once per mark interval; MarkEvery 0 never marks.
func TestScriptsMarkCandidates(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	ctx := context.Background()
	sc := newVirtual()
	m := NewModel()
	c := Common{StaticRate: 100, StaticBurst: 200, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8,
		DemandWindow: 500 * time.Millisecond, MarkEvery: 250 * time.Millisecond}
	idle := KeysFor(DefaultPrefix, quota.Key{Tenant: "idle", Class: "read"})
	hot := KeysFor(DefaultPrefix, quota.Key{Tenant: "hot", Class: "read"})
	strict := KeysFor(DefaultPrefix, quota.Key{Tenant: "strict", Class: "read"})
	granted := KeysFor(DefaultPrefix, quota.Key{Tenant: "granted", Class: "read"})
	off := KeysFor(DefaultPrefix, quota.Key{Tenant: "off", Class: "read"})
	// A region on its floor may run a key at a share of 0: only demand
	// above nothing marks it.
	floor := KeysFor(DefaultPrefix, quota.Key{Tenant: "floor", Class: "read"})
	floorc := c
	floorc.StaticRate, floorc.StaticBurst = 0, 0
	t0 := int64(1_800_000_000_000_000)
	now := t0
	at := func(d time.Duration) { now = t0 + d.Microseconds(); sc.setNow(now) }
	seq := map[string]uint64{}
	used := map[string]int64{}
	// lease reports u more tokens used on k's lease and compares both sides.
	lease := func(k Keys, cm Common, u int64) {
		t.Helper()
		seq[k.Member]++
		used[k.Member] += u
		r := Report{Instance: "i", Incarnation: 1, Lease: 1, Seq: seq[k.Member], Used: used[k.Member], Want: 100, Min: 1}
		want := m.Sync(now, k, cm, r)
		got, err := sc.Sync(ctx, rdb, k, cm, r)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("sync %s: %+v, %v; model %+v", k.Member, got, err, want)
		}
	}
	check := func(k Keys, cost int64) {
		t.Helper()
		want := m.Check(now, k, c, cost)
		got, err := sc.Check(ctx, rdb, k, c, cost)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("check %s: %+v, %v; model %+v", k.Member, got, err, want)
		}
	}
	cands := func(want map[string]int64) {
		t.Helper()
		zs, err := rdb.ZRangeWithScores(ctx, DefaultPrefix+"cand", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for _, z := range zs {
			got[z.Member.(string)] = int64(z.Score)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("candidates %v, want %v", got, want)
		}
		if mc := m.Candidates(DefaultPrefix + "cand"); !reflect.DeepEqual(mc, want) {
			t.Fatalf("model candidates %v, want %v", mc, want)
		}
		if ms, rs := m.Snapshot(), snapshot(ctx, t, rdb); !reflect.DeepEqual(ms, rs) {
			t.Fatalf("state differs\n redis: %v\n model: %v", rs, ms)
		}
	}
	us := func(d time.Duration) int64 { return t0 + d.Microseconds() }
	offc := c
	offc.MarkEvery = 0

	at(0)
	lease(idle, c, 0)
	lease(hot, c, 0)
	lease(off, offc, 0)
	lease(floor, floorc, 0)
	cands(map[string]int64{})
	at(500 * time.Millisecond)
	lease(floor, floorc, 0)
	cands(map[string]int64{})
	// One second later: idle asks 40/s (< 50 = s_r/2), hot 60/s, off 60/s
	// with marking off.
	at(time.Second)
	lease(idle, c, 40)
	lease(hot, c, 60)
	lease(off, offc, 60)
	lease(floor, floorc, 1)
	cands(map[string]int64{"hot|read": us(time.Second), "floor|read": us(time.Second)})
	// Within the mark interval nothing is read again.
	at(time.Second + 100*time.Millisecond)
	lease(hot, c, 6)
	cands(map[string]int64{"hot|read": us(time.Second), "floor|read": us(time.Second)})
	at(time.Second + 300*time.Millisecond)
	lease(hot, c, 18)
	cands(map[string]int64{"hot|read": us(time.Second + 300*time.Millisecond), "floor|read": us(time.Second)})

	// The strict path: 10 tokens per 100ms is 100/s ≥ 50; 2 per 100ms is
	// 20/s, not.
	for i := range 6 {
		at(2*time.Second + time.Duration(i)*100*time.Millisecond)
		check(strict, 2)
	}
	if _, ok := m.Candidates(DefaultPrefix + "cand")["strict|read"]; ok {
		t.Fatal("a strict key at 20/s was marked")
	}
	for i := range 6 {
		at(3*time.Second + time.Duration(i)*100*time.Millisecond)
		check(strict, 10)
	}
	if got := m.Candidates(DefaultPrefix + "cand")["strict|read"]; got == 0 {
		t.Fatal("a strict key at 100/s was not marked")
	}

	// A grant marks until its expiry; a demand mark after it keeps it.
	at(4 * time.Second)
	exp := us(9 * time.Second)
	want := m.SetRate(now, granted, c, 10, 20, exp, now, 0)
	got, err := sc.SetRate(ctx, rdb, granted, c, 10, 20, exp, now, 0)
	if err != nil || !reflect.DeepEqual(got, want) || !got.Applied {
		t.Fatalf("set_rate %+v, %v; model %+v", got, err, want)
	}
	lease(granted, c, 0)
	at(5 * time.Second)
	lease(granted, c, 100)
	if got := m.Candidates(DefaultPrefix + "cand")["granted|read"]; got != exp {
		t.Fatalf("granted key's mark %d, want its expiry %d", got, exp)
	}
	cands(map[string]int64{"hot|read": us(time.Second + 300*time.Millisecond), "floor|read": us(time.Second),
		"strict|read": m.Candidates(DefaultPrefix + "cand")["strict|read"], "granted|read": exp})
	// The leader's trim removes what ended before its horizon.
	m.TrimCandidates(DefaultPrefix+"cand", us(3*time.Second))
	if err := rdb.ZRemRangeByScore(ctx, DefaultPrefix+"cand", "-inf", "("+strconv.FormatInt(us(3*time.Second), 10)).Err(); err != nil {
		t.Fatal(err)
	}
	cands(map[string]int64{"strict|read": m.Candidates(DefaultPrefix + "cand")["strict|read"], "granted|read": exp})
}
