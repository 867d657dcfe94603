package luascripts

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// twin runs every operation through the scripts on a real redis-server
// and through Model at the same Redis instant, and fails on the first
// reply or stored state that differs. The edge tests below drive it onto
// the exact boundaries (an instant equal to an expiry, a value equal to a
// threshold) that random sequences reach only by chance, and pin what the
// key does there.
type twin struct {
	t   *testing.T
	ctx context.Context
	rdb *redis.Client
	sc  *Scripts
	m   *Model
	now int64
}

func newTwin(t *testing.T) *twin {
	w := &twin{t: t, ctx: context.Background(), rdb: redistest.Start(t).Client(), sc: newVirtual(), m: NewModel()}
	w.at(1_800_000_000_000_000)
	return w
}

func (w *twin) at(us int64) { w.now = us; w.sc.setNow(us) }

func (w *twin) same(what string, got, want any, err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatalf("%s: script error: %v", what, err)
	}
	if !reflect.DeepEqual(got, want) {
		w.t.Fatalf("%s: reply differs\n lua:   %+v\n model: %+v", what, got, want)
	}
	if rs, ms := snapshot(w.ctx, w.t, w.rdb), w.m.Snapshot(); !reflect.DeepEqual(rs, ms) {
		w.t.Fatalf("%s: state differs\n redis: %v\n model: %v", what, rs, ms)
	}
}

func (w *twin) sync(k Keys, c Common, r Report) LeaseReply {
	w.t.Helper()
	want := w.m.Sync(w.now, k, c, r)
	got, err := w.sc.Sync(w.ctx, w.rdb, k, c, r)
	w.same("sync "+r.Instance, got, want, err)
	return got
}

func (w *twin) acquire(k Keys, c Common, r Report) LeaseReply {
	w.t.Helper()
	want := w.m.Acquire(w.now, k, c, r)
	got, err := w.sc.Acquire(w.ctx, w.rdb, k, c, r)
	w.same("acquire "+r.Instance, got, want, err)
	return got
}

func (w *twin) release(k Keys, c Common, r Report) ReleaseReply {
	w.t.Helper()
	want := w.m.Release(w.now, k, c, r)
	got, err := w.sc.Release(w.ctx, w.rdb, k, c, r)
	w.same("release "+r.Instance, got, want, err)
	return got
}

func (w *twin) check(k Keys, c Common, cost int64) CheckReply {
	w.t.Helper()
	want := w.m.Check(w.now, k, c, cost)
	got, err := w.sc.Check(w.ctx, w.rdb, k, c, cost)
	w.same("check", got, want, err)
	return got
}

func (w *twin) setRate(k Keys, c Common, rate, burst float64, exp, issued int64) SetRateReply {
	w.t.Helper()
	return w.setRateDeposit(k, c, rate, burst, exp, issued, 0)
}

func (w *twin) setRateDeposit(k Keys, c Common, rate, burst float64, exp, issued int64, deposit float64) SetRateReply {
	w.t.Helper()
	want := w.m.SetRate(w.now, k, c, rate, burst, exp, issued, deposit)
	got, err := w.sc.SetRate(w.ctx, w.rdb, k, c, rate, burst, exp, issued, deposit)
	w.same("set_rate", got, want, err)
	return got
}

func (w *twin) state(k Keys, c Common) State {
	w.t.Helper()
	want := w.m.State(w.now, k, c)
	got, err := w.sc.State(w.ctx, w.rdb, k, c)
	w.same("state", got, want, err)
	return got
}

// TestLeaseEndsAtItsExpiry: a lease is live strictly before its expiry and
// over at it. A report arriving one microsecond before renews the lease and
// reclaims nothing; one arriving exactly at the (renewed) expiry finds the
// lease over even when no reaping runs (reap budget 0): its unspent tokens
// come back (reclaim: reported) and the report opens a new lease.
func TestLeaseEndsAtItsExpiry(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 1, StaticBurst: 100, LeaseTTL: time.Second, Reclaim: true, ReapBudget: 0,
		DemandWindow: 500 * time.Millisecond}
	t0 := w.now
	w.at(t0)
	if r := w.sync(k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 30, Min: 1}); r.Granted != 30 {
		t.Fatalf("first lease granted %d, want 30", r.Granted)
	}
	w.at(t0 + 1_000_000 - 1)
	r := w.sync(k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 5, Want: 10, Min: 1})
	if r.Reclaimed != 0 || r.Granted != 10 || r.Live != 1 {
		t.Fatalf("a report 1µs before the lease's expiry: %+v, want the lease renewed (granted 10, nothing reclaimed)", r)
	}
	// Now 40 granted, 5 used: 35 unspent until t0 + 2s - 1.
	w.at(t0 + 2_000_000 - 1)
	r = w.sync(k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 3, Used: 7, Want: 10, Min: 1})
	if r.Reclaimed != 35 || r.Granted != 10 || r.Live != 1 {
		t.Fatalf("a report at the lease's expiry: %+v, want its 35 unspent tokens reclaimed and a new lease of 10", r)
	}
}

// TestWaitAtTheSmallestRate: a rate of one billionth of a token per second
// still refills, so an empty bucket's wait for a token is finite (about
// 10^12 ms); below it the scripts answer never (-1, RetryNever), so a
// caller is not promised a wait no clock reaches.
func TestWaitAtTheSmallestRate(t *testing.T) {
	w := newTwin(t)
	// The static rate is the smallest too: a grant below it would be
	// cut at one refresh (TestRetryEndsWithTheGrant).
	c := Common{StaticRate: 1e-9, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	for i, tc := range []struct {
		rate  float64
		never bool
	}{
		{1e-9, false},
		{0.999999999e-9, true},
	} {
		k := KeysFor(DefaultPrefix, quota.Key{Tenant: "slow", Class: string(rune('a' + i))})
		// The bucket made full at a static rate of 1/s (a fresh bucket
		// at 1e-9/s holds what it refilled since the epoch: 1.8 tokens).
		if r := w.check(k, Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}, 1); !r.Allowed {
			t.Fatalf("a fresh bucket at 1/s denied 1: %+v", r)
		}
		// A grant that lasts past the wait: the wait is cut at its end.
		w.setRate(k, c, tc.rate, 5, w.now+2_000_000_000_000_000, w.now)
		if r := w.check(k, c, 5); !r.Allowed {
			t.Fatalf("rate %g: a full bucket of 5 denied 5: %+v", tc.rate, r)
		}
		r := w.check(k, c, 1)
		if r.Allowed || (r.RetryAfter < 0) != tc.never || (!tc.never && r.RetryAfter < 999_999_999_999*time.Millisecond) {
			t.Fatalf("rate %g: empty bucket answered %+v, want denied with never=%v (else a wait of 10^12 ms)", tc.rate, r, tc.never)
		}
	}
}

// TestRetryEndsWithTheGrant: a wait worked out at a grant's rate is cut at
// the grant's end, when the rate is no longer known (the next grant, the
// static share or the floor), and under a grant below the static share
// (the share lent away) at one refresh, when the region's demand has won
// it back: under a grant of 0.04/s, burst 1, ending in 5 s, with a static
// 10/s, a request for a token of an empty bucket (25 s at that rate) is
// told one refresh (1 s), on the strict path and the lease path alike; a
// grant's end nearer than that cuts it there; the reset time (until the
// bucket is full) is not cut, nor a wait that ends before the grant does,
// nor one under the static rate after the grant ended. A grant above the
// static share (borrowed) is cut at its end only.
func TestRetryEndsWithTheGrant(t *testing.T) {
	w := newTwin(t)
	c := Common{StaticRate: 10, StaticBurst: 20, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: 500 * time.Millisecond}
	strict := KeysFor(DefaultPrefix, quota.Key{Tenant: "sliver", Class: "strict"})
	leased := KeysFor(DefaultPrefix, quota.Key{Tenant: "sliver", Class: "lease"})
	for _, k := range []Keys{strict, leased} {
		w.setRate(k, c, 0.04, 1, w.now+5_000_000, w.now)
	}
	if r := w.check(strict, c, 1); !r.Allowed {
		t.Fatalf("the grant's one token: %+v, want allowed", r)
	}
	r := w.check(strict, c, 1)
	if r.Allowed || r.RetryAfter != time.Second || r.Reset != 25*time.Second {
		t.Fatalf("an empty bucket under a lent-away 0.04/s until 5s from now: %+v, want retry after 1s (one refresh), reset 25s", r)
	}
	if r := w.check(leased, c, 1); !r.Allowed {
		t.Fatalf("the grant's one token: %+v, want allowed", r)
	}
	g := w.sync(leased, c, Report{Instance: "i-b", Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1})
	if g.Granted != 0 || g.RetryAfter != time.Second {
		t.Fatalf("a lease of a token of an empty bucket: %+v, want nothing granted, retry after 1s", g)
	}
	w.at(w.now + 4_500_000)
	if r := w.check(strict, c, 1); r.Allowed || r.RetryAfter != 500*time.Millisecond {
		t.Fatalf("4.5s later (0.18 token refilled): %+v, want retry after 500ms (the grant's end)", r)
	}
	w.at(w.now + 500_000)
	if r := w.check(strict, c, 1); r.Allowed || r.RetryAfter != 80*time.Millisecond {
		t.Fatalf("at the grant's end, 0.2 token and the static 10/s after: %+v, want retry after 80ms, uncut", r)
	}
	w.at(w.now + 80_000)
	if r := w.check(strict, c, 1); !r.Allowed {
		t.Fatalf("80ms after the grant's end: %+v, want allowed", r)
	}
	if r := w.check(strict, c, 5); r.Allowed || r.RetryAfter != 500*time.Millisecond {
		t.Fatalf("5 tokens at the static 10/s: %+v, want retry after 500ms", r)
	}

	for _, tc := range []struct {
		tenant string
		static float64
	}{
		{"borrower", 0.01}, // above the static share: borrowed
		{"at-share", 0.04}, // the static share itself: nothing lent
	} {
		c := Common{StaticRate: tc.static, StaticBurst: 1, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: 500 * time.Millisecond}
		k := KeysFor(DefaultPrefix, quota.Key{Tenant: tc.tenant, Class: "strict"})
		w.setRate(k, c, 0.04, 1, w.now+5_000_000, w.now)
		if r := w.check(k, c, 1); !r.Allowed {
			t.Fatalf("%s: the grant's one token: %+v, want allowed", tc.tenant, r)
		}
		if r := w.check(k, c, 1); r.Allowed || r.RetryAfter != 5*time.Second {
			t.Fatalf("an empty bucket under 0.04/s (static %v/s) until 5s from now: %+v, want retry after 5s (the grant's end)", tc.static, r)
		}
	}
}

// TestFreshBucketRefillsFromTheEpoch: without a restart wait a missing
// bucket counts as empty since Redis time 0 and the refill credits it up
// to its cap; at the smallest rate that is not the cap but 1.8 tokens at
// 1.8e15µs, remainder and all, so the first decision sees exactly them.
func TestFreshBucketRefillsFromTheEpoch(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "epoch", Class: "read"})
	c := Common{StaticRate: 1e-9, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	if r := w.check(k, c, 1); !r.Allowed || r.Remaining != 0 {
		t.Fatalf("first check at %dus: %+v, want allowed with nothing whole left", w.now, r)
	}
	if st := w.state(k, c); st.Tokens != 0.8 {
		t.Fatalf("tokens %v, want 0.8 (1.8 refilled since the epoch, 1 taken)", st.Tokens)
	}
}

// TestModelExpiresKeysAtTheirDeadline: the Model drops a key at the instant
// its TTL runs out, not before (as ExpireDue documents), so the harnesses
// that replay Redis expiry on virtual time never keep a key past it; a
// dropped key has no TTL left. The lease records live in the bucket and
// the expiry set (more than fewLeases leases) lives as long as the bucket.
func TestModelExpiresKeysAtTheirDeadline(t *testing.T) {
	m := NewModel()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 10, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	t0 := int64(1_800_000_000_000_000)
	for i := range fewLeases + 1 {
		m.Sync(t0, k, c, Report{Instance: fmt.Sprintf("i-%d", i), Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1})
	}
	ttl, ok := m.LastTTL(k.Bucket)
	if xt, xok := m.LastTTL(k.Expiry); !ok || !xok || ttl <= 0 || xt != ttl {
		t.Fatalf("bucket TTL %v, %v; expiry set TTL %v, %v", ttl, ok, xt, xok)
	}
	if _, ok := m.LastTTL(k.Leases); ok {
		t.Fatal("the Model has a lease hash: the records live in the bucket")
	}
	deadline := t0 + ttl.Microseconds()
	if gone := m.ExpireDue(deadline - 1); len(gone) != 0 {
		t.Fatalf("expired %v 1µs before the deadline", gone)
	}
	if gone := m.ExpireDue(deadline); !reflect.DeepEqual(gone, []string{k.Bucket, k.Expiry}) {
		t.Fatalf("at the deadline expired %v, want the bucket (with its lease records) and its expiry set", gone)
	}
	for _, name := range []string{k.Bucket, k.Expiry} {
		if ttl, ok := m.LastTTL(name); ok || ttl != 0 {
			t.Fatalf("%s after its expiry: TTL %v, %v; want none (0, false)", name, ttl, ok)
		}
	}
}

// cands reads a candidate set from Redis and requires the Model's to match.
func (w *twin) cands(name string) map[string]int64 {
	w.t.Helper()
	zs, err := w.rdb.ZRangeWithScores(w.ctx, name, 0, -1).Result()
	if err != nil {
		w.t.Fatal(err)
	}
	got := map[string]int64{}
	for _, z := range zs {
		got[z.Member.(string)] = int64(z.Score)
	}
	if mc := w.m.Candidates(name); !reflect.DeepEqual(mc, got) {
		w.t.Fatalf("candidates: redis %v, model %v", got, mc)
	}
	return got
}

// trim is the region leader's trim of a candidate set (ZREMRANGEBYSCORE
// -inf (below) on both sides.
func (w *twin) trim(name string, below int64) {
	w.t.Helper()
	w.m.TrimCandidates(name, below)
	if err := w.rdb.ZRemRangeByScore(w.ctx, name, "-inf", "("+itoa(below)).Err(); err != nil {
		w.t.Fatal(err)
	}
	w.cands(name)
}

// TestCandidateMarksAtExactThresholds: a key whose lease demand reads
// exactly half its static share needs the global tier and is marked; a
// grant is valid strictly before its expiry, so a key served by leases
// alone whose grant ends at this very instant reads and writes nothing
// for candidates (no mark window is opened); a mark window closes exactly
// one mark interval after it opened; on a share of 0 only demand above
// nothing marks; a trim keeps a mark whose score equals its bound.
func TestCandidateMarksAtExactThresholds(t *testing.T) {
	w := newTwin(t)
	c := Common{StaticRate: 100, StaticBurst: 200, LeaseTTL: 5 * time.Second, Reclaim: true, ReapBudget: 8,
		DemandWindow: 500 * time.Millisecond, MarkEvery: 250 * time.Millisecond}
	t0 := w.now

	// 25 tokens over the 500ms window: 50 tokens/s, half of 100.
	half := KeysFor(DefaultPrefix, quota.Key{Tenant: "half", Class: "read"})
	w.sync(half, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 100, Min: 1})
	if got := w.cands(half.Cand); len(got) != 0 {
		t.Fatalf("marked %v before any demand was read", got)
	}
	w.at(t0 + 500_000)
	w.sync(half, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 25, Want: 100, Min: 1})
	if st := w.state(half, c); st.LeaseDemand != 50 {
		t.Fatalf("lease demand %v, want exactly 50 tokens/s", st.LeaseDemand)
	}
	if got := w.cands(half.Cand); got[half.Member] != t0+500_000 {
		t.Fatalf("candidates %v: a demand of exactly half the share not marked at the reading", got)
	}

	// A grant valid until t1, a lease without demand reporting at t1.
	ended := KeysFor(DefaultPrefix, quota.Key{Tenant: "ended", Class: "read"})
	t1 := t0 + 2_000_000
	w.sync(ended, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 5, Min: 1})
	w.setRate(ended, c, 10, 10, t1, w.now)
	w.at(t1)
	w.sync(ended, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Want: 5, Min: 1})
	if w.rdb.HExists(w.ctx, ended.Bucket, "cw").Val() {
		t.Fatal("a key whose grant ended at this instant opened a mark window")
	}
	if st := w.state(ended, c); st.GrantExpiryUS != 0 || st.Rate != c.StaticRate {
		t.Fatalf("state at the grant's expiry %+v, want the static rate and no grant", st)
	}

	// A strict key: its first decision opens a window and marks it; the
	// next window opens exactly 250ms later, when 20 tokens in it read
	// 80 tokens/s.
	strict := KeysFor(DefaultPrefix, quota.Key{Tenant: "strict", Class: "read"})
	w.at(t0)
	w.check(strict, c, 20)
	w.at(t0 + 250_000)
	w.check(strict, c, 20)
	if got := w.cands(strict.Cand); got[strict.Member] != t0+250_000 {
		t.Fatalf("candidates %v: the window one mark interval old was not read", got)
	}
	w.trim(strict.Cand, t0+250_000)
	if got := w.cands(strict.Cand); got[strict.Member] != t0+250_000 {
		t.Fatalf("candidates %v: a trim below the mark's own score removed it", got)
	}

	// Strict demand a hair below half (50 tokens over 1.000001s) does not
	// mark; exactly half (50 over the next 1s) does.
	hair := KeysFor(DefaultPrefix, quota.Key{Tenant: "hair", Class: "read"})
	w.at(t0)
	w.check(hair, c, 1)
	w.at(t0 + 1_000_001)
	w.check(hair, c, 50)
	if got := w.cands(hair.Cand); got[hair.Member] != 0 {
		t.Fatalf("candidates %v: strict demand just below half marked", got)
	}
	w.at(t0 + 2_000_001)
	w.check(hair, c, 50)
	if got := w.cands(hair.Cand); got[hair.Member] != t0+2_000_001 {
		t.Fatalf("candidates %v: strict demand of exactly half not marked", got)
	}

	// Lease demand (10/s) and strict demand together below half: no mark.
	mixed := KeysFor(DefaultPrefix, quota.Key{Tenant: "mixed", Class: "read"})
	w.at(t0)
	w.sync(mixed, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 100, Min: 1})
	w.at(t0 + 500_000)
	w.sync(mixed, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 5, Want: 100, Min: 1})
	w.check(mixed, c, 1)
	if st := w.state(mixed, c); st.LeaseDemand != 10 {
		t.Fatalf("lease demand %v/s, want 10", st.LeaseDemand)
	}
	if got := w.cands(mixed.Cand); got[mixed.Member] != 0 {
		t.Fatalf("candidates %v: lease and strict demand below half marked", got)
	}

	// Lease demand a hair below half (4999 tokens over 100s of build time:
	// 49.99/s) is no candidate: without strict demand it opens no mark
	// window either.
	below := KeysFor(DefaultPrefix, quota.Key{Tenant: "below", Class: "read"})
	w.at(t0)
	w.sync(below, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 100, Min: 1, BuiltUS: 1})
	w.at(t0 + 1_000)
	w.sync(below, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 4999, Want: 100, Min: 1,
		BuiltUS: 1 + 100_000_000})
	if st := w.state(below, c); st.LeaseDemand != 49.99 {
		t.Fatalf("lease demand %v/s, want 49.99", st.LeaseDemand)
	}
	if w.rdb.HExists(w.ctx, below.Bucket, "cw").Val() {
		t.Fatal("lease demand just below half opened a mark window")
	}
	if got := w.cands(below.Cand); got[below.Member] != 0 {
		t.Fatalf("candidates %v: lease demand just below half marked", got)
	}
	// A strict decision opens the window; the reading it adds (one token
	// since the epoch) leaves the sum below half: still no mark.
	w.check(below, c, 1)
	if got := w.cands(below.Cand); got[below.Member] != 0 {
		t.Fatalf("candidates %v: lease demand just below half and a trickle of strict demand marked", got)
	}

	// A key on a share of 0, strict-checked once (marked), then read by a
	// lease report without demand a window later: nothing to mark.
	floor := KeysFor(DefaultPrefix, quota.Key{Tenant: "floor", Class: "read"})
	fc := c
	fc.StaticRate, fc.StaticBurst = 0, 0
	w.at(t0)
	w.check(floor, fc, 1)
	if got := w.cands(floor.Cand); got[floor.Member] != t0 {
		t.Fatalf("candidates %v: a strict decision on a share of 0 not marked", got)
	}
	w.at(t0 + 1_000_000)
	w.sync(floor, fc, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1})
	if got := w.cands(floor.Cand); got[floor.Member] != t0 {
		t.Fatalf("candidates %v: no demand in the window moved the mark of a key on a share of 0", got)
	}

	// On a share of 0 the smallest lease reading there is, a thousandth of
	// a token per second (one token denied over 1000s), marks.
	trickle := KeysFor(DefaultPrefix, quota.Key{Tenant: "trickle", Class: "read"})
	tc := fc
	tc.LeaseTTL = 2000 * time.Second
	w.at(t0)
	w.sync(trickle, tc, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1})
	w.at(t0 + 1000_000_000)
	w.sync(trickle, tc, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Denied: 1, Want: 1, Min: 1})
	if st := w.state(trickle, tc); st.LeaseDemand != 0.001 {
		t.Fatalf("lease demand %v/s, want 0.001", st.LeaseDemand)
	}
	if got := w.cands(trickle.Cand); got[trickle.Member] != t0+1000_000_000 {
		t.Fatalf("candidates %v: a reading of 0.001/s on a share of 0 not marked", got)
	}
	// A new lease of the instance carries that reading.
	w.sync(trickle, tc, Report{Instance: "i-a", Incarnation: 1, Lease: 3, Seq: 3, Want: 1, Min: 1})
	if st := w.state(trickle, tc); st.LeaseDemand != 0.001 {
		t.Fatalf("lease demand %v/s after a new lease, want the 0.001 carried", st.LeaseDemand)
	}
}

// TestGrantOfTheSameReportApplies: grants are ordered by when their report
// was sent, and one sent at the same instant as the grant in force
// replaces it (the leader installs every answer to a report, the same
// grant again or a corrected one); only an older one is refused.
func TestGrantOfTheSameReportApplies(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	issued := w.now - 1_000
	if r := w.setRate(k, c, 5, 50, w.now+10_000_000, issued); !r.Applied {
		t.Fatalf("first grant not applied: %+v", r)
	}
	if r := w.setRate(k, c, 7, 70, w.now+20_000_000, issued); !r.Applied {
		t.Fatalf("a grant of the same report refused: %+v", r)
	}
	if r := w.setRate(k, c, 9, 90, w.now+30_000_000, issued-1); r.Applied {
		t.Fatalf("an older grant applied: %+v", r)
	}
	if st := w.state(k, c); st.Rate != 7 || st.Cap != 70 || st.GrantExpiryUS != w.now+20_000_000 {
		t.Fatalf("state %+v, want the second grant (7/s, cap 70) in force", st)
	}
}

// TestLeaseRecordVarintBoundaries: compact lease records carry numbers at
// every varint group boundary (127, 128, 2^14 - 1, 2^14, 2^21) and
// incarnations of every width the split into high and low ten digits
// treats apart (1, 10, 11, 19 and 20 digits) exactly: the scripts write
// the bytes the Model writes, a record reads back as written, and the
// lease's next report continues it (no conflict, no duplicate).
func TestLeaseRecordVarintBoundaries(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 1000, StaticBurst: 3_000_000, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	cases := []struct {
		want int64
		inc  uint64
	}{
		{127, 7},
		{128, 1_234_567_890},
		{16383, 12_345_678_901},
		{16384, 1 << 63},
		{1 << 21, 18_446_744_073_709_551_615},
	}
	for i, tc := range cases {
		id := "i-" + itoa(int64(i))
		r := Report{Instance: id, Incarnation: tc.inc, Lease: 128, Seq: 128, Want: tc.want, Min: 1}
		if g := w.sync(k, c, r); g.Granted != tc.want || g.Conflict || g.Duplicate {
			t.Fatalf("lease of %d for incarnation %d: %+v", tc.want, tc.inc, g)
		}
		rec := leaseRecordOf(w.ctx, t, w.rdb, k, id)
		l, err := ParseLeaseRecord(rec)
		if err != nil || rec[0] != compactMark || l.Granted != float64(tc.want) || l.Seq != 128 || l.Lease != 128 ||
			l.Incarnation != strconv.FormatUint(tc.inc, 10) {
			t.Fatalf("record %q reads back as %+v, %v; want compact, granted %d, seq 128, incarnation %d", rec, l, err, tc.want, tc.inc)
		}
		r.Seq, r.Used, r.Want = 129, 128, 0
		if g := w.sync(k, c, r); g.Conflict || g.Duplicate {
			t.Fatalf("the next report on incarnation %d's record: %+v", tc.inc, g)
		}
	}
}

// TestExpirySetGoesAtFewLeases: the expiry set exists exactly while a key
// has more than fewLeases leases: the fifth lease makes it, a release
// that leaves four deletes it at once, reaping four leases reads their
// records without making one, and the next fifth lease makes it again.
func TestExpirySetGoesAtFewLeases(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	set := func(what string, want bool) {
		t.Helper()
		if got := w.rdb.Exists(w.ctx, k.Expiry).Val() == 1; got != want {
			t.Fatalf("%s: expiry set present %v, want %v", what, got, want)
		}
	}
	for i := 0; i <= fewLeases; i++ {
		w.sync(k, expiryCommon, expiryLease("i-"+itoa(int64(i)), 1))
		set("lease "+itoa(int64(i+1)), i+1 > fewLeases)
	}
	r := expiryLease("i-0", 2)
	r.Want = 0
	w.release(k, expiryCommon, r)
	set("a release leaving four leases", false)
	w.state(k, expiryCommon)
	set("reaping four leases", false)
	w.sync(k, expiryCommon, expiryLease("i-0", 3))
	set("a fifth lease again", true)
}

// TestUnreadableBornSentinelIsRestamped: a born sentinel that does not
// read as a number counts as missing, as the scripts that create buckets
// count it: stamping dates the data set from now (conservative: no bucket
// is trusted full on it).
func TestUnreadableBornSentinelIsRestamped(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	if err := w.rdb.Set(w.ctx, k.Born, "garbage", 0).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := w.sc.StampBorn(w.ctx, w.rdb, []string{k.Born}, false)
	if err != nil || len(got) != 1 || !got[0].Written || got[0].BornUS != w.now {
		t.Fatalf("stamping an unreadable sentinel: %+v, %v; want it written with now (%d)", got, err, w.now)
	}
	if v := w.rdb.Get(w.ctx, k.Born).Val(); v != itoa(w.now) {
		t.Fatalf("sentinel %q after stamping, want %d", v, w.now)
	}
}

// lease reads instance's lease record from Redis and requires the Model's
// to be the same.
func (w *twin) lease(k Keys, instance string) LeaseRecord {
	w.t.Helper()
	rec, err := w.rdb.HGet(w.ctx, k.Bucket, leaseField(instance)).Result()
	if err != nil {
		w.t.Fatalf("lease %s: %v", instance, err)
	}
	l, err := ParseLeaseRecord(rec)
	if err != nil {
		w.t.Fatal(err)
	}
	if ml, ok := w.m.PeekLease(k, instance); !ok || !reflect.DeepEqual(ml, l) {
		w.t.Fatalf("lease %s: redis %+v, model %+v (%v)", instance, l, ml, ok)
	}
	return l
}

// TestReportsBeyondTheLeaseAreCapped: a report's new usage counts against
// what the lease still holds (granted less used less returned), and its
// returned tokens against what is left after that usage; the excess is
// booked as admitted but takes nothing more from the bucket's books, and
// returned tokens within the lease go back to the bucket at once.
func TestReportsBeyondTheLeaseAreCapped(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 1, StaticBurst: 100, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 10, Min: 1}
	if g := w.sync(k, c, r); g.Granted != 10 || g.Remaining != 90 {
		t.Fatalf("lease of 10 from a full bucket of 100: %+v", g)
	}
	// 2 used, 1 returned: 7 left in the lease, the 1 back in the bucket.
	r.Seq, r.Used, r.Returned, r.Want = 2, 2, 1, 0
	w.sync(k, c, r)
	if st, l := w.state(k, c), w.lease(k, "i-a"); st.Tokens != 91 || st.Outstanding != 7 || l.Used != 2 || l.Returned != 1 {
		t.Fatalf("after 2 used and 1 returned: bucket %+v, lease %+v; want 91 tokens, 7 out, 2 used, 1 returned", st, l)
	}
	// 1 more returned: 6 left.
	r.Seq, r.Returned = 3, 2
	w.sync(k, c, r)
	if st, l := w.state(k, c), w.lease(k, "i-a"); st.Tokens != 92 || st.Outstanding != 6 || l.Returned != 2 {
		t.Fatalf("after 1 more returned: bucket %+v, lease %+v; want 92 tokens, 6 out, 2 returned", st, l)
	}
	// 8 more used (of 6 left) and 1 more returned (of none left).
	r.Seq, r.Used, r.Returned = 4, 10, 3
	w.sync(k, c, r)
	if st, l := w.state(k, c), w.lease(k, "i-a"); st.Tokens != 92 || st.Outstanding != 0 || st.Admitted != 10 ||
		l.Used != 8 || l.Returned != 2 {
		t.Fatalf("after usage beyond the lease: bucket %+v, lease %+v; want 92 tokens, none out, 10 admitted, 8 used, 2 returned", st, l)
	}
	// The simulator's oracle reads the same bucket without a script.
	if p, ok := w.m.PeekBucket(k); !ok || p.Tokens != 92 || p.Outstanding != 0 || p.Admitted != 10 || p.NowUS != w.now {
		t.Fatalf("peek %+v, %v; want the stored bucket", p, ok)
	}
	if _, ok := w.m.PeekBucket(KeysFor(DefaultPrefix, quota.Key{Tenant: "none", Class: "read"})); ok {
		t.Fatal("peek found a bucket that was never written")
	}
}

// expire deletes from Redis the keys the Model says are due at the twin's
// now (Redis itself expires on its own clock, not the virtual one) and
// returns them.
func (w *twin) expire() []string {
	w.t.Helper()
	gone := w.m.ExpireDue(w.now)
	if len(gone) > 0 {
		if err := w.rdb.Del(w.ctx, gone...).Err(); err != nil {
			w.t.Fatal(err)
		}
	}
	return gone
}

// TestLeaseRecordsExpireWithTheirBucket: a key's lease records live in
// its bucket (lib.lua, "Layouts"), so a grant that ends (shortening the
// bucket's TTL) takes them with the bucket: the fresh bucket after it has
// no record, no demand (a reading of a million tokens per second before),
// nothing out, and is full. (Older scripts renewed a separate lease hash
// only when leases were written or tokens out, so the bucket could expire
// before its records.)
func TestLeaseRecordsExpireWithTheirBucket(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 1000, StaticBurst: 1000, LeaseTTL: time.Second, Reclaim: true, ReapBudget: 8,
		DemandWindow: time.Millisecond}
	t0 := w.now
	w.setRate(k, c, 1000, 1000, t0+100_000_000, t0)
	r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 1000, Min: 1}
	if g := w.sync(k, c, r); g.Granted != 1000 {
		t.Fatalf("lease of the whole bucket: %+v", g)
	}
	w.at(t0 + 1_000)
	r.Seq, r.Used, r.Want = 2, 1000, 0
	w.sync(k, c, r)
	if st := w.state(k, c); st.LeaseDemand != 1_000_000 || st.Outstanding != 0 {
		t.Fatalf("after 1000 tokens in 1ms: %+v, want a reading of exactly 1e6/s and nothing out", st)
	}
	if l := w.lease(k, "i-a"); l.DemandRate != 1_000_000 || l.WindowStartUS != t0+1_000 || l.AppliedUsed != 1000 {
		t.Fatalf("lease record %+v, want the reading of 1e6/s, a window opened at the report", l)
	}
	// A grant ending at once: the bucket's TTL falls to 3s, its lease
	// record with it.
	w.at(t0 + 2_000)
	w.setRate(k, c, 1000, 1000, w.now, w.now)
	if bt, _ := w.m.LastTTL(k.Bucket); bt != 3*time.Second {
		t.Fatalf("bucket TTL %v, want 3s", bt)
	}
	if rt := w.rdb.PTTL(w.ctx, k.Bucket).Val(); rt > 3*time.Second || rt < time.Second {
		t.Fatalf("bucket PTTL %v in Redis, want 3s", rt)
	}
	w.at(t0 + 2_000 + 3_000_000)
	if gone := w.expire(); !reflect.DeepEqual(gone, []string{k.Bucket}) {
		t.Fatalf("expired %v, want the bucket and its records", gone)
	}
	if st := w.state(k, c); st.LeaseDemand != 0 || st.Outstanding != 0 || st.Tokens != 1000 {
		t.Fatalf("fresh bucket after the old one expired: %+v, want no demand, nothing out, full", st)
	}
	if n := w.rdb.Exists(w.ctx, k.Leases).Val(); n != 0 {
		t.Fatal("a lease hash exists: the records live in the bucket")
	}
}

// TestEvictedBucketTakesItsLeasesAlong: a bucket lost on its own while a
// lease holds an unspent token and a demand reading of 0.001/s (evicted
// under memory pressure) takes the lease's record with it (lib.lua,
// "Layouts"). Releasing that lease, or reporting its last token used, is
// then a call about a lease the region does not know: it gives nothing
// back and creates nothing, and the fresh bucket keeps nothing out and no
// demand, and is full.
func TestEvictedBucketTakesItsLeasesAlong(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(w *twin, k Keys, c Common, r Report)
	}{
		{"release", func(w *twin, k Keys, c Common, r Report) {
			if rel := w.release(k, c, r); rel.Returned != 0 || rel.Conflict {
				w.t.Fatalf("release of a lease the evicted bucket took along: %+v, want nothing back", rel)
			}
		}},
		{"last token used", func(w *twin, k Keys, c Common, r Report) {
			// The last token over 3000s more: a reading of 0 (1/3000 per
			// second rounds to nothing) replacing the lease's 0.001/s.
			r.Used, r.BuiltUS = 2, 1+4_000_000_000
			if g := w.sync(k, c, r); g.Granted != 0 || g.Live != 0 {
				w.t.Fatalf("report of a lease the evicted bucket took along: %+v, want nothing granted, no lease", g)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newTwin(t)
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
			c := Common{StaticRate: 1000, StaticBurst: 1000, LeaseTTL: time.Second, Reclaim: true, ReapBudget: 8,
				DemandWindow: time.Millisecond}
			t0 := w.now
			r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 2, Min: 1, BuiltUS: 1}
			if g := w.sync(k, c, r); g.Granted != 2 {
				t.Fatalf("lease of two tokens: %+v", g)
			}
			// One token used over 1000s of build time: 1/1000 per second.
			w.at(t0 + 1_000)
			r.Seq, r.Used, r.Want, r.BuiltUS = 2, 1, 0, 1+1_000_000_000
			w.sync(k, c, r)
			if st := w.state(k, c); st.LeaseDemand != 0.001 || st.Outstanding != 1 {
				t.Fatalf("after one of two tokens used: %+v, want a reading of 0.001/s and one token out", st)
			}
			if err := w.rdb.Del(w.ctx, k.Bucket).Err(); err != nil {
				t.Fatal(err)
			}
			delete(w.m.buckets, k.Bucket)
			delete(w.m.leases, k.Bucket)
			w.at(t0 + 2_000)
			r.Seq = 3
			tc.end(w, k, c, r)
			if st := w.state(k, c); st.LeaseDemand != 0 || st.Outstanding != 0 || st.Tokens != 1000 {
				t.Fatalf("fresh bucket after the old lease's last report: %+v, want no demand, nothing out, full", st)
			}
			if rec := leaseRecordOf(w.ctx, t, w.rdb, k, "i-a"); rec != "" {
				t.Fatalf("lease record %q after the bucket was evicted", rec)
			}
		})
	}
}

// TestStateReadRenewsTTLs: a read of a key (state.lua writing nothing)
// renews the bucket's TTL to bucket_ttl at the read's instant, and the
// lease records with it, as a writing call would; the Model sets the same
// TTLs and expires the keys at exactly their deadline.
// Under a grant the TTL shrinks as the grant runs down, so a renewed TTL
// and a kept one differ on the real server too.
func TestStateReadRenewsTTLs(t *testing.T) {
	w := newTwin(t)
	c := Common{StaticRate: 10, StaticBurst: 100, LeaseTTL: time.Minute, ReapBudget: 8, DemandWindow: time.Millisecond}
	t0 := w.now
	spent := KeysFor(DefaultPrefix, quota.Key{Tenant: "spent", Class: "read"}) // its lease used up
	holds := KeysFor(DefaultPrefix, quota.Key{Tenant: "holds", Class: "read"}) // 5 tokens still out
	for _, k := range []Keys{spent, holds} {
		w.at(t0)
		w.setRate(k, c, 10, 100, t0+1000_000_000, t0)
		w.sync(k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 10, Min: 1})
	}
	// At 1s the TTL is the grant's 999s left + 2 x 100 / 10 s + 1s.
	w.at(t0 + 1_000_000)
	w.sync(spent, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 10})
	w.sync(holds, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 5})
	// At 50s it is 971s.
	w.at(t0 + 50_000_000)
	w.state(spent, c)
	w.state(holds, c)
	for _, tc := range []struct {
		key  string
		want time.Duration
	}{
		{spent.Bucket, 971 * time.Second},
		{holds.Bucket, 971 * time.Second},
	} {
		m, _ := w.m.LastTTL(tc.key)
		r, err := w.rdb.PTTL(w.ctx, tc.key).Result()
		if err != nil || m != tc.want || r > tc.want || r < tc.want-10*time.Second {
			t.Fatalf("%s: TTL %v in redis (%v), %v in the model; want %v", tc.key, r, err, m, tc.want)
		}
	}
	// Every key's deadline is t0 + 1021s.
	w.at(t0 + 1021_000_000 - 1)
	if gone := w.expire(); len(gone) != 0 {
		t.Fatalf("expired %v 1µs before the deadline", gone)
	}
	w.at(t0 + 1021_000_000)
	want := []string{holds.Bucket, spent.Bucket}
	sort.Strings(want)
	if gone := w.expire(); !reflect.DeepEqual(gone, want) {
		t.Fatalf("at the deadline expired %v, want %v", gone, want)
	}
}

// TestReportKinds: a report on a live lease is told apart by its
// incarnation, lease number, sequence number and cumulative totals, at
// every boundary: the same message again is a retry (answered with the
// grant it had); a later one whose totals went back is a conflict (the
// lease is forfeited); an earlier one is stale (answered with nothing)
// unless its totals exceed what was applied; one of an older lease is
// stale whatever its totals; one of a newer lease replaces the record.
func TestReportKinds(t *testing.T) {
	w := newTwin(t)
	c := Common{StaticRate: 1, StaticBurst: 100, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	first := Report{Instance: "i-a", Incarnation: 1, Lease: 2, Seq: 5, Used: 10, Denied: 4, Returned: 2, Want: 20, Min: 1}
	type kind int
	const (
		retry kind = iota
		fresh
		stale
		conflict
	)
	for i, tc := range []struct {
		name                   string
		inc, lease, seq        uint64
		used, denied, returned int64
		want                   kind
	}{
		{"retry", 1, 2, 5, 10, 4, 2, retry},
		{"same seq, more used", 1, 2, 5, 11, 4, 2, conflict},
		{"same seq, more denied", 1, 2, 5, 10, 5, 2, conflict},
		{"same seq, more returned", 1, 2, 5, 10, 4, 3, conflict},
		{"next seq, same totals", 1, 2, 6, 10, 4, 2, fresh},
		{"next seq, less used", 1, 2, 6, 9, 4, 2, conflict},
		{"next seq, less denied", 1, 2, 6, 10, 3, 2, conflict},
		{"next seq, less returned", 1, 2, 6, 10, 4, 1, conflict},
		{"earlier seq, same totals", 1, 2, 4, 10, 4, 2, stale},
		{"earlier seq, less used", 1, 2, 4, 9, 4, 2, stale},
		{"earlier seq, less denied", 1, 2, 4, 10, 3, 2, stale},
		{"earlier seq, less returned", 1, 2, 4, 10, 4, 1, stale},
		{"earlier seq, more used", 1, 2, 4, 11, 4, 2, conflict},
		{"earlier seq, more denied", 1, 2, 4, 10, 5, 2, conflict},
		{"earlier seq, more returned", 1, 2, 4, 10, 4, 3, conflict},
		{"older lease, later seq, more used", 1, 1, 6, 100, 4, 2, stale},
		{"newer lease", 1, 3, 6, 0, 0, 0, fresh},
		{"other incarnation", 2, 2, 6, 10, 4, 2, conflict},
	} {
		k := KeysFor(DefaultPrefix, quota.Key{Tenant: "t" + itoa(int64(i)), Class: "read"})
		if g := w.sync(k, c, first); g.Granted != 20 {
			t.Fatalf("%s: first lease %+v, want 20 granted", tc.name, g)
		}
		g := w.sync(k, c, Report{Instance: "i-a", Incarnation: tc.inc, Lease: tc.lease, Seq: tc.seq,
			Used: tc.used, Denied: tc.denied, Returned: tc.returned, Want: 7, Min: 1})
		var ok bool
		switch tc.want {
		case retry:
			ok = g.Duplicate && !g.Conflict && g.Granted == 20 && g.Live == 1
		case fresh:
			ok = !g.Duplicate && !g.Conflict && g.Granted == 7 && g.Live == 1
		case stale:
			ok = g.Duplicate && !g.Conflict && g.Granted == 0 && g.Live == 1
		case conflict:
			ok = !g.Duplicate && g.Conflict && g.Granted == 0 && g.Live == 0
		}
		if !ok {
			t.Fatalf("%s: %+v, want kind %d", tc.name, g, tc.want)
		}
	}
}

// TestCheckReapsWhileTokensAreOut: a strict check reaps expired leases
// when any token is out, a single one included (it comes back with
// Reclaim), and leaves a spent lease's record to the lease calls.
func TestCheckReapsWhileTokensAreOut(t *testing.T) {
	w := newTwin(t)
	c := Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Second, Reclaim: true, ReapBudget: 8, DemandWindow: time.Millisecond}
	t0 := w.now
	one := KeysFor(DefaultPrefix, quota.Key{Tenant: "one", Class: "read"})
	spent := KeysFor(DefaultPrefix, quota.Key{Tenant: "spent", Class: "read"})
	w.sync(one, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1})
	w.sync(spent, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 1, Min: 1})
	w.sync(spent, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 2, Used: 1})
	w.at(t0 + 1_000_000)
	if r := w.check(one, c, 1); r.Reclaimed != 1 || !r.Allowed || r.Remaining != 9 {
		t.Fatalf("check after a one-token lease expired: %+v, want its token reclaimed (9 left after 1)", r)
	}
	if n := len(leaseRecords(w.ctx, t, w.rdb, one)); n != 0 {
		t.Fatalf("%d lease records left after reaping", n)
	}
	if r := w.check(spent, c, 1); r.Reclaimed != 0 || !r.Allowed {
		t.Fatalf("check on a key with nothing out: %+v", r)
	}
	if n := len(leaseRecords(w.ctx, t, w.rdb, spent)); n != 1 {
		t.Fatalf("%d lease records after a check with nothing out, want the spent lease's record kept", n)
	}
}

// TestClockIsRedisTime: the scripts' clock is Redis TIME in microseconds:
// a call's now lies between the server's TIME read before and after it.
func TestClockIsRedisTime(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Start(t).Client()
	sc := New()
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	for i := range 3 {
		before, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		r, err := sc.Check(ctx, rdb, k, c, 1)
		if err != nil {
			t.Fatal(err)
		}
		after, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if r.NowUS < before.UnixMicro() || r.NowUS > after.UnixMicro() {
			t.Fatalf("call %d: now %d µs, want between the server's TIME before (%d) and after (%d)", i, r.NowUS, before.UnixMicro(), after.UnixMicro())
		}
	}
}

// TestStateReadAndInstallCountReclaimed: the region leader's state reads
// and grant installs reap expired leases as every call does, and say how
// many tokens they gave back (sluice_regional_reclaimed_tokens_total counts
// them: in a region with a leader, they reap most leases of dead
// instances before any instance's call does).
func TestStateReadAndInstallCountReclaimed(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 1, StaticBurst: 100, LeaseTTL: time.Second, Reclaim: true, ReapBudget: 10,
		DemandWindow: 500 * time.Millisecond}
	t0 := w.now
	w.at(t0)
	if r := w.sync(k, c, Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 30, Min: 1}); r.Granted != 30 {
		t.Fatalf("first lease granted %d, want 30", r.Granted)
	}
	w.at(t0 + 1_000_000 - 1)
	if st := w.state(k, c); st.Reclaimed != 0 || st.Outstanding != 30 {
		t.Fatalf("a read before the lease's expiry: %+v, want nothing reclaimed, 30 out", st)
	}
	w.at(t0 + 1_000_000)
	if st := w.state(k, c); st.Reclaimed != 30 || st.Outstanding != 0 {
		t.Fatalf("a read at the lease's expiry: %+v, want its 30 tokens reclaimed", st)
	}
	if r := w.sync(k, c, Report{Instance: "i-b", Incarnation: 1, Lease: 1, Seq: 1, Want: 20, Min: 1}); r.Granted != 20 {
		t.Fatalf("second lease granted %d, want 20", r.Granted)
	}
	w.at(t0 + 2_000_000)
	if sr := w.setRate(k, c, 2, 100, t0+5_000_000, t0+2_000_000); sr.Reclaimed != 20 || sr.Outstanding != 0 {
		t.Fatalf("an install at the second lease's expiry: %+v, want its 20 tokens reclaimed", sr)
	}
}
