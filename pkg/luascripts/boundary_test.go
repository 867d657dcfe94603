package luascripts

import (
	"bufio"
	"fmt"
	"net"
	"reflect"
	"regexp"
	"strconv"
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
			res, err := w.sc.born.Run(w.ctx, w.rdb, []string{k.Born, k.Gen}, "0", 0, w.now).Slice()
			if want := []any{tc.wantBorn(t0), int64(0), int64(GenJump), int64(0)}; err != nil || !reflect.DeepEqual(res, want) {
				t.Fatalf("born script on a stored sentinel: %v, %v; want %v (the birth, not written)", res, err, want)
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
			if err != nil || len(res) != 10 || res[0] != int64(0) || res[2] != int64(-1) {
				t.Fatalf("check of %d: reply %v, %v; want denied with retry -1", tc.cost, res, err)
			}
			r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: tc.cost, Min: tc.cost}
			res, err = w.sc.acquire.Run(w.ctx, w.rdb, k.list(), w.sc.args(k, tc.c, r.opArgs()...)...).Slice()
			if err != nil || len(res) != 15 || res[0] != int64(0) || res[3] != int64(-1) || res[9] != int64(0) || res[11] != int64(0) || res[12] != int64(0) {
				t.Fatalf("lease of %d: reply %v, %v; want nothing granted, retry -1, no duplicate (0), no conflict (0), nothing returned (0)", tc.cost, res, err)
			}
		})
	}
}

// TestWaitOfTheLargestClockIsNever: a wait of exactly maxMS (2^43 ms, the
// largest a clock holds) is never (-1), and one millisecond less is
// answered as it is. The wait here is the refill of one token at 1/s
// (1000ms) after the restart wait still ahead of a bucket created inside it.
func TestWaitOfTheLargestClockIsNever(t *testing.T) {
	const maxMS = 1 << 43
	for _, tc := range []struct {
		wait time.Duration
		want time.Duration
	}{
		{(maxMS - 1001) * time.Millisecond, (maxMS - 1) * time.Millisecond},
		{(maxMS - 1000) * time.Millisecond, -1},
	} {
		w := newTwin(t)
		w.at(1_000_000)
		k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
		c := Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Second, RestartWait: tc.wait, ReapBudget: 8,
			DemandWindow: time.Millisecond}
		if r := w.check(k, c, 1); r.Allowed || r.RetryAfter != tc.want {
			t.Fatalf("restart wait %v: check %+v, want denied with retry %v", tc.wait, r, tc.want)
		}
	}
}

var pexpireRE = regexp.MustCompile(`"PEXPIRE" "([^"]*)" "(-?[0-9]+)"`)

// pexpires runs call and returns the TTL (ms) each key was last given by
// a PEXPIRE during it, read from the server's MONITOR feed: the exact
// argument, where PTTL would count down in real time.
func (w *twin) pexpires(call func()) map[string]int64 {
	w.t.Helper()
	conn, err := net.Dial("tcp", w.rdb.Options().Addr)
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Close()
	// A guard against a feed that never shows the end mark, not a bound
	// the test relies on.
	if err := conn.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		w.t.Fatal(err)
	}
	rd := bufio.NewReader(conn)
	if _, err := fmt.Fprint(conn, "MONITOR\r\n"); err != nil {
		w.t.Fatal(err)
	}
	if line, err := rd.ReadString('\n'); err != nil || line != "+OK\r\n" {
		w.t.Fatalf("MONITOR: %q, %v", line, err)
	}
	call()
	const end = "pexpires-end"
	endRE := regexp.MustCompile(`"(?i:echo)" "` + end + `"`)
	if err := w.rdb.Echo(w.ctx, end).Err(); err != nil {
		w.t.Fatal(err)
	}
	got := map[string]int64{}
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			w.t.Fatalf("MONITOR feed: %v", err)
		}
		if m := pexpireRE.FindStringSubmatch(line); m != nil {
			got[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
		}
		if endRE.MatchString(line) {
			return got
		}
	}
}

// TestBucketTTLIsExact: the TTL a call gives a key is, to the millisecond,
// the grant's remaining validity (ms, rounded up, while it is valid) plus
// two refills of the larger of the static and the granted cap at the
// static rate (rounded up), at least twice the lease TTL, plus a second;
// at most 2^43 ms. A grant ending at this very instant adds nothing.
func TestBucketTTLIsExact(t *testing.T) {
	c := func(rate, burst float64, lease time.Duration) Common {
		return Common{StaticRate: rate, StaticBurst: burst, LeaseTTL: lease, ReapBudget: 8, DemandWindow: time.Millisecond}
	}
	type grant struct {
		rate, burst float64
		in          int64 // µs from now to the grant's expiry
	}
	for _, tc := range []struct {
		name  string
		c     Common
		grant *grant
		later int64 // µs after the grant at which a check runs (0: no check)
		want  int64
	}{
		{"two refills", c(1, 10, time.Second), nil, 0, 20_000 + 1000},
		{"two refills rounded up", c(3, 10, time.Second), nil, 0, 6667 + 1000},
		{"twice the lease TTL", c(100, 10, 5*time.Second), nil, 0, 10_000 + 1000},
		{"twice the lease TTL above one refill", c(1, 3, 5*time.Second), nil, 0, 10_000 + 1000},
		{"two refills a little above twice the lease TTL", c(1, 6, 5*time.Second), nil, 0, 12_000 + 1000},
		{"the largest TTL", c(1e-9, 1e9, time.Second), nil, 0, 1 << 43},
		{"a grant's larger cap and validity", c(1, 10, time.Second), &grant{2, 50, 3_000_500}, 0, 3001 + 100_000 + 1000},
		{"a grant's smaller cap", c(1, 10, time.Second), &grant{2, 5, 3_000_500}, 0, 3001 + 20_000 + 1000},
		{"a grant ending now", c(1, 10, time.Second), &grant{2, 50, 0}, 0, 20_000 + 1000},
		{"a stored grant later", c(1, 10, time.Second), &grant{2, 50, 3_000_500}, 1_000_000, 2001 + 100_000 + 1000},
		{"a stored grant at its expiry", c(1, 10, time.Second), &grant{2, 50, 3_000_500}, 3_000_500, 20_000 + 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newTwin(t)
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
			got := w.pexpires(func() {
				if tc.grant == nil {
					w.check(k, tc.c, 1)
					return
				}
				w.setRate(k, tc.c, tc.grant.rate, tc.grant.burst, w.now+tc.grant.in, w.now)
				if tc.later > 0 {
					w.at(w.now + tc.later)
					w.check(k, tc.c, 1)
				}
			})
			if got[k.Bucket] != tc.want {
				t.Fatalf("bucket TTL %dms, want %dms (all: %v)", got[k.Bucket], tc.want, got)
			}
			if mt, ok := w.m.LastTTL(k.Bucket); !ok || mt != time.Duration(tc.want)*time.Millisecond {
				t.Fatalf("model TTL %v, %v; want %dms", mt, ok, tc.want)
			}
		})
	}
}

// TestGrantEndingNowMarksNothing: a grant is valid strictly before its
// expiry, so a strict decision at the very instant it ends, with demand
// far below half the static share, closes the mark window without marking
// the key (the grant's own mark, up to its expiry, already trimmed).
func TestGrantEndingNowMarksNothing(t *testing.T) {
	w, k, c, end := withGrantEndingInASecond(t)
	if got := w.cands(k.Cand); got[k.Member] != end {
		t.Fatalf("candidates %v after the grant, want marked until its expiry %d", got, end)
	}
	w.at(end)
	w.trim(k.Cand, end+1)
	if r := w.check(k, c, 1); !r.Allowed {
		t.Fatalf("a check of 1: %+v", r)
	}
	if got := w.cands(k.Cand); len(got) != 0 {
		t.Fatalf("candidates %v after a check at the grant's expiry with no demand, want none", got)
	}
	if cw := w.rdb.HGet(w.ctx, k.Bucket, "cw").Val(); cw != itoa(end) {
		t.Fatalf("mark window start %q, want %d (closed by the check)", cw, end)
	}
}

// TestStateReadRebuildsAnOlderExpirySet: a key with more than fewLeases
// leases whose expiry set does not hold every record (one written by
// older scripts) has the set rebuilt from the records by the next call
// that reaps, a state read included, even when no lease has expired.
func TestStateReadRebuildsAnOlderExpirySet(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	want := map[string]int64{}
	for i := 0; i <= fewLeases; i++ {
		id := "i-" + itoa(int64(i))
		w.sync(k, expiryCommon, expiryLease(id, 1))
		want[id] = w.now + expiryCommon.LeaseTTL.Microseconds()
		w.at(w.now + 1000)
	}
	if err := w.rdb.ZRem(w.ctx, k.Expiry, "i-0", "i-1").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.sc.State(w.ctx, w.rdb, k, expiryCommon); err != nil {
		t.Fatal(err)
	}
	zs, err := w.rdb.ZRangeWithScores(w.ctx, k.Expiry, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, z := range zs {
		got[z.Member.(string)] = int64(z.Score)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("expiry set after a state read %v, want every lease's expiry %v", got, want)
	}
}

// TestBatchRepliesOncePerKey: a batched call answers exactly one entry per
// key, whatever the number of keys.
func TestBatchRepliesOncePerKey(t *testing.T) {
	w := newTwin(t)
	c := Common{StaticRate: 1, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	for n := 1; n <= 6; n++ {
		var ks []string
		var as []any
		for i := range n {
			k := KeysFor(DefaultPrefix, quota.Key{Tenant: "t" + itoa(int64(i)), Class: "read"})
			a := w.sc.args(k, c)
			if i == 0 {
				as = append(as, len(a))
			}
			ks = append(ks, k.list()...)
			as = append(as, a...)
		}
		res, err := w.sc.stateBatch.Run(w.ctx, w.rdb, ks, as...).Slice()
		if err != nil || len(res) != n {
			t.Fatalf("a batch of %d keys: %d entries (%v), %v; want %d", n, len(res), res, err, n)
		}
		for i, r := range res {
			if _, ok := r.([]any); !ok {
				t.Fatalf("a batch of %d keys: entry %d is %T (%v), want a state reply", n, i, r, r)
			}
		}
	}
}

// TestDemandWindowClosesAtItsLength: a lease's demand window closes at the
// first report at least the demand window after it opened: a report one
// microsecond short of it adds to the open window and the reading stays
// at nothing (5 tokens against a rate of nothing are within a Poisson
// count's noise, so the window does not close early either); the next,
// exactly at it, closes the window over all it counted (5 + 5 tokens over
// 500ms: 20/s).
func TestDemandWindowClosesAtItsLength(t *testing.T) {
	w := newTwin(t)
	k, c := demandKey()
	t0 := w.now
	r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 100, Min: 1}
	w.sync(k, c, r)
	w.at(t0 + c.DemandWindow.Microseconds() - 1)
	r.Seq, r.Used = 2, 5
	w.sync(k, c, r)
	if st := w.state(k, c); st.LeaseDemand != 0 {
		t.Fatalf("reading %v/s one microsecond before the window's end, want 0 (still open)", st.LeaseDemand)
	}
	w.at(t0 + c.DemandWindow.Microseconds())
	r.Seq, r.Denied = 3, 5
	w.sync(k, c, r)
	if st := w.state(k, c); st.LeaseDemand != 20 {
		t.Fatalf("reading %v/s at the window's end, want 20 (10 tokens over 500ms)", st.LeaseDemand)
	}
}

// TestDemandWindowClosesEarlyOnAChange: from a fifth of the demand window
// on, a window closes at a report whose demand is a plain change from the
// lease's last rate (more than a factor of two, beyond three standard
// deviations of a Poisson count), so a shift is read within a tenth of a
// refresh; a steady demand's reports leave it open. The lease reads
// 100/s first (50 tokens over 500ms), or 10,000/s.
func TestDemandWindowClosesEarlyOnAChange(t *testing.T) {
	dwin := 500 * time.Millisecond
	for _, tc := range []struct {
		name  string
		first int64         // tokens over the first window
		after time.Duration // since the second window opened
		used  int64         // tokens reported over it
		want  float64       // reading after the report
	}{
		{"a rise at a fifth of the window", 50, dwin / 5, 60, 600},
		{"a fall at a fifth of the window", 50, dwin / 5, 0, 0},
		{"a rise just short of a fifth", 50, dwin/5 - time.Microsecond, 60, 100},
		{"a steady demand at a fifth", 50, dwin / 5, 10, 100},
		{"noise: 16 for 10 expected", 50, dwin / 5, 16, 100},
		{"twice the rate but within the noise", 50, dwin / 5, 20, 100},
		{"at the noise: 15 above, 3 × √25 = 15", 50, dwin / 5, 25, 100},
		{"past the noise", 50, dwin / 5, 26, 260},
		{"a fall to a tenth, within the noise", 50, dwin / 5, 1, 100},
		{"past the noise, less than twice", 5000, dwin / 5, 1400, 10000},
		{"past the noise, more than twice", 5000, dwin / 5, 2001, 20010},
		{"down by half: not a factor of two", 5000, dwin / 5, 500, 10000},
		{"down by more than half", 5000, dwin / 5, 499, 4990},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newTwin(t)
			k, c := demandKey()
			t0 := w.now
			r := Report{Instance: "i-a", Incarnation: 1, Lease: 1, Seq: 1, Want: 100, Min: 1}
			w.sync(k, c, r)
			w.at(t0 + dwin.Microseconds())
			r.Seq, r.Used = 2, tc.first
			w.sync(k, c, r)
			if st, want := w.state(k, c), float64(tc.first*2); st.LeaseDemand != want {
				t.Fatalf("first reading %v/s, want %v", st.LeaseDemand, want)
			}
			w.at(t0 + (dwin + tc.after).Microseconds())
			r.Seq, r.Used = 3, tc.first+tc.used
			w.sync(k, c, r)
			if st := w.state(k, c); st.LeaseDemand != tc.want {
				t.Fatalf("%d tokens %v into the window: reading %v/s, want %v", tc.used, tc.after, st.LeaseDemand, tc.want)
			}
		})
	}
}

// TestRefillCarriesFractionsOfAMicroToken: refill below a micro-token per
// call is carried, not dropped: at 0.75 tokens/s an empty bucket earns
// 0.75 micro-tokens a microsecond, so two strict decisions a microsecond
// apart leave it one whole micro-token, and a third one more.
func TestRefillCarriesFractionsOfAMicroToken(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 0.75, StaticBurst: 10, LeaseTTL: time.Second, ReapBudget: 8, DemandWindow: time.Millisecond}
	if r := w.check(k, c, 10); !r.Allowed {
		t.Fatalf("a check of the full bucket: %+v", r)
	}
	for i, want := range []float64{0, 0.000001, 0.000002} {
		w.at(w.now + 1)
		if r := w.check(k, c, 1); r.Allowed {
			t.Fatalf("step %d: a check of 1 on an empty bucket admitted: %+v", i, r)
		}
		if st := w.state(k, c); st.Tokens != want {
			t.Fatalf("step %d: %v tokens, want %v", i, st.Tokens, want)
		}
	}
}

// TestReapDropsAnExpiryWithoutARecord: an expiry set of as many members
// as there are records but naming an instance with no record (left by
// older scripts) is read as it is; its due member without a record is
// taken out of the set and nothing else changes.
func TestReapDropsAnExpiryWithoutARecord(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	for i := 0; i <= fewLeases; i++ {
		w.sync(k, expiryCommon, expiryLease("i-"+itoa(int64(i)), 1))
	}
	if err := w.rdb.ZRem(w.ctx, k.Expiry, "i-0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := w.rdb.ZAdd(w.ctx, k.Expiry, redisZ(w.now-1, "gone")).Err(); err != nil {
		t.Fatal(err)
	}
	st, err := w.sc.State(w.ctx, w.rdb, k, expiryCommon)
	if err != nil {
		t.Fatalf("a state read over an expiry without a record: %v", err)
	}
	if want := int64(fewLeases+1) * 10; st.Outstanding != want {
		t.Fatalf("outstanding %d, want %d (no lease reaped)", st.Outstanding, want)
	}
	if w.rdb.ZScore(w.ctx, k.Expiry, "gone").Err() == nil {
		t.Fatal("the expiry without a record is still in the set")
	}
	if n := len(leaseRecords(w.ctx, t, w.rdb, k)); n != fewLeases+1 {
		t.Fatalf("%d leases, want %d", n, fewLeases+1)
	}
}

// TestGenerationLostWhileSeenRebirths: a data set whose write generation
// is gone while its caller has seen one (a snapshot older than the key's
// first write, the born sentinel kept) lost writes that were seen, as one
// whose generation went back does: the next call re-births it and the
// bucket starts empty, in the scripts and the model alike.
func TestGenerationLostWhileSeenRebirths(t *testing.T) {
	w := newTwin(t)
	k := KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c := Common{StaticRate: 10, StaticBurst: 20, LeaseTTL: time.Second, ReapBudget: 8,
		RestartWait: 2 * time.Second, DemandWindow: 500 * time.Millisecond}
	if r := w.check(k, c, 1); r.Reborn || w.sc.Generations().Seen(k.Born) <= 0 {
		t.Fatalf("first check: %+v, seen generation %d; want a generation seen and no re-birth", r, w.sc.Generations().Seen(k.Born))
	}
	w.at(w.now + 10_000_000)
	if err := w.rdb.Del(w.ctx, k.Gen).Err(); err != nil {
		t.Fatal(err)
	}
	delete(w.m.gen, k.Gen)
	r := w.check(k, c, 1)
	if !r.Reborn || r.Allowed {
		t.Fatalf("check after the generation was lost: %+v, want a re-birth and the empty bucket's denial", r)
	}
}

// withGrantEndingInASecond is a twin whose key acme/read, under a static
// share of 100/s with mark windows of 250 ms over a 500 ms demand window,
// holds a grant of 10/s that ends one second from the twin's now (end, in
// µs): the grant marks the key until then.
func withGrantEndingInASecond(t *testing.T) (w *twin, k Keys, c Common, end int64) {
	t.Helper()
	w = newTwin(t)
	k = KeysFor(DefaultPrefix, quota.Key{Tenant: "acme", Class: "read"})
	c = Common{StaticRate: 100, StaticBurst: 200, LeaseTTL: 5 * time.Second, ReapBudget: 8,
		DemandWindow: 500 * time.Millisecond, MarkEvery: 250 * time.Millisecond}
	end = w.now + 1_000_000
	w.setRate(k, c, 10, 10, end, w.now)
	return w, k, c, end
}
