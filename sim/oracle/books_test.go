package oracle

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// twoByTwo: two regions and two keys, so every (key, region) has its own
// books: key u/c rate 100 burst 200, key v/c rate 10 burst 20, static
// shares half each.
func twoByTwo(t *testing.T) *Oracle {
	t.Helper()
	o, err := New(Setup{
		Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}},
		Keys: []Key{
			{Key: quota.Key{Tenant: "u", Class: "c"}, Rate: 100, Burst: 200, StaticRate: []float64{50, 50}, StaticBurst: []float64{100, 100}},
			{Key: quota.Key{Tenant: "v", Class: "c"}, Rate: 10, Burst: 20, StaticRate: []float64{5, 5}, StaticBurst: []float64{10, 10}},
		},
		Epoch: time.Second, Duration: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestBooksArePerKeyAndRegion: each (key, region) keeps its own counts,
// pending decisions and retired buckets; a bucket matching its own pair's
// books passes although another pair's differ, and one over by a single
// token is a violation naming its key and region.
func TestBooksArePerKeyAndRegion(t *testing.T) {
	type pair struct{ key, region int }
	pairs := []pair{{0, 0}, {0, 1}, {1, 0}, {1, 1}}
	run := func(over pair, pending pair, gone pair) *Result {
		o := twoByTwo(t)
		for i, p := range pairs {
			o.Decided(sec, p.region, p.key, int64(1+i), SourceLease)
			o.Decided(sec, p.region, p.key, int64(10+i), SourceDenied)
		}
		o.RegionPending(pending.region, pending.key, 3)
		for i, p := range pairs {
			b := Bucket{NowUS: 2e6, Cap: 1, Admitted: int64(1 + i), Denied: int64(10 + i)}
			if p == pending {
				b.Admitted += 3
			}
			if p == over {
				b.Denied++
			}
			o.BucketObserved(2*sec, p.region, p.key, b)
		}
		// One bucket expires; its successor starts full and counts from
		// zero. The others hold what they held and count on.
		o.BucketGone(gone.region, gone.key)
		o.Decided(3*sec, gone.region, gone.key, 2, SourceLease)
		for i, p := range pairs {
			b := Bucket{NowUS: 2e6, Cap: 1, Admitted: int64(1 + i), Denied: int64(10 + i)}
			if p == pending {
				b.Admitted += 3
			}
			if p == gone {
				b = Bucket{NowUS: 2e6, Tokens: 1, Cap: 1, Admitted: 2}
			}
			o.BucketObserved(3*sec, p.region, p.key, b)
		}
		return o.Finish(4 * sec)
	}
	none := pair{-1, -1}
	for _, p := range pairs {
		for _, q := range pairs {
			if r := run(none, p, q); r.Books.Violations != 0 || r.Books.Checks != 8 || r.Holding.Violations != 0 {
				t.Fatalf("pending at %v, bucket gone at %v: exact books flagged: %+v %+v", p, q, r.Books, r.Holding)
			}
		}
	}
	for _, p := range pairs {
		i := p.key*2 + p.region
		r := run(p, pairs[(i+1)%4], pairs[(i+2)%4])
		b := r.Books
		wantKey := []string{"u/c", "v/c"}[p.key]
		if b.Violations != 1 || b.MaxOver != 1 || b.FirstKey != wantKey || b.FirstRegion != []string{"a", "b"}[p.region] ||
			b.FirstAt != 2*sec || !strings.Contains(b.FirstDetail, "denied") {
			t.Fatalf("one denial over at %v: %+v", p, b)
		}
	}
}

// TestBooksCountRetiredBucketsAcrossExpiry: an expired bucket's counters
// stay in the books, so a successor counting the same decisions again is
// a double count, for admissions and denials alike.
func TestBooksCountRetiredBucketsAcrossExpiry(t *testing.T) {
	for _, c := range []struct {
		name       string
		admB, denB int64
		wantOver   float64
		wantDetail string
	}{
		{"successor counts anew", 4, 1, 0, ""},
		{"admissions counted again", 11, 1, 7, "admitted"},
		{"denials counted again", 4, 3, 2, "denied"},
		{"one admission over", 5, 1, 1, "admitted"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := oneKey(t, 10, 20, nil)
			o.Decided(sec, 0, 0, 7, SourceLease)
			o.Decided(sec, 0, 0, 2, SourceDenied)
			o.BucketObserved(2*sec, 0, 0, Bucket{NowUS: 2e6, Cap: 20, Admitted: 7, Denied: 2})
			o.BucketGone(0, 0)
			o.BucketGone(0, 0) // once gone, gone: nothing retired twice
			o.Decided(3*sec, 0, 0, 4, SourceLease)
			o.Decided(3*sec, 0, 0, 1, SourceDenied)
			o.BucketObserved(4*sec, 0, 0, Bucket{NowUS: 4e6, Cap: 20, Admitted: c.admB, Denied: c.denB})
			r := o.Finish(5 * sec)
			if c.wantOver == 0 {
				if r.Books.Violations != 0 {
					t.Fatalf("flagged: %+v", r.Books)
				}
				return
			}
			if r.Books.Violations != 1 || r.Books.MaxOver != c.wantOver || !strings.Contains(r.Books.FirstDetail, c.wantDetail) || r.Pass() {
				t.Fatalf("want one violation of %v %s: %+v", c.wantOver, c.wantDetail, r.Books)
			}
		})
	}
}

// TestNewBucketIsNotJudgedByItsPredecessor: a bucket created after the
// previous one expired starts full; only its cap bounds it, not the
// growth since the old bucket's last state.
func TestNewBucketIsNotJudgedByItsPredecessor(t *testing.T) {
	o := oneKey(t, 10, 20, nil)
	o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Tokens: 0, Cap: 20, Rate: 10})
	o.BucketGone(0, 0)
	o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Tokens: 20, Cap: 20, Rate: 10})
	if r := o.Finish(2 * sec); r.Holding.Violations != 0 || r.Holding.Checks != 2 {
		t.Fatalf("a new full bucket flagged: %+v", r.Holding)
	}
	// Without the expiry the same jump is tokens from nowhere.
	o = oneKey(t, 10, 20, nil)
	o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Tokens: 0, Cap: 20, Rate: 10})
	o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Tokens: 20, Cap: 20, Rate: 10})
	if r := o.Finish(2 * sec); r.Holding.Violations != 1 || r.Holding.MaxOver != 20 {
		t.Fatalf("a jump of 20 tokens not flagged: %+v", r.Holding)
	}
}

// TestHoldingGrowthBounds: growth between two calls is bounded by the
// refill at the highest rate in force (a valid grant's or the static
// share's) plus two storage roundings; what it holds by the cap plus one.
func TestHoldingGrowthBounds(t *testing.T) {
	// Static rate 10, cap far away so only growth is judged.
	prev := Bucket{NowUS: 1e6, Tokens: 5, Cap: 1000}
	grow := func(rate float64, dtUS int64) float64 {
		// The oracle's own arithmetic, at run time.
		p := prev.Tokens + prev.Outstanding
		return p + rate*float64(dtUS)/1e6
	}
	cases := []struct {
		name          string
		grantRate     float64
		grantExpiryUS int64
		dtUS          int64
		hold          float64
		violation     bool
		over          float64
	}{
		{"static refill exactly", 0, 0, 500_000, grow(10, 500_000), false, 0},
		{"static refill plus two roundings", 0, 0, 500_000, grow(10, 500_000) + 2*holdTol, false, 0},
		{"static refill plus one and a half roundings", 0, 0, 500_000, grow(10, 500_000) + 1.5*holdTol, false, 0},
		{"static refill plus two and a half roundings", 0, 0, 500_000, grow(10, 500_000) + 2.5*holdTol, true, 2.5 * holdTol},
		{"a token over the static refill", 0, 0, 500_000, grow(10, 500_000) + 1, true, 1},
		{"valid grant's higher rate", 30, 3e6, 500_000, grow(30, 500_000), false, 0},
		{"over the grant's rate", 30, 3e6, 500_000, grow(30, 500_000) + 0.5, true, 0.5},
		{"grant expiring at the call counts the static rate", 30, 1e6, 500_000, grow(30, 500_000), true, 10},
		{"grant expired before the call", 30, 999_999, 500_000, grow(30, 500_000), true, 10},
		{"grant below the static share: the static rate bounds", 2, 3e6, 500_000, grow(10, 500_000), false, 0},
		{"no time passed", 0, 0, 0, prev.Tokens + 2*holdTol, false, 0},
		{"no time passed, grown", 0, 0, 0, prev.Tokens + 0.001, true, 0.001},
		{"older reading: growth not judged", 0, 0, -500_000, grow(10, 500_000) + 1, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := oneKey(t, 10, 20, func(k *Key) { k.StaticBurst = []float64{1000}; k.Burst = 1000 })
			p := prev
			p.GrantRate, p.GrantExpiryUS = c.grantRate, c.grantExpiryUS
			o.BucketObserved(sec, 0, 0, p)
			o.BucketObserved(2*sec, 0, 0, Bucket{NowUS: prev.NowUS + c.dtUS, Tokens: c.hold, Cap: 1000})
			r := o.Finish(3 * sec)
			if got := r.Holding.Violations != 0; got != c.violation || r.Holding.Checks != 2 {
				t.Fatalf("holding %.9f: violation %v, want %v: %+v", c.hold, got, c.violation, r.Holding)
			}
			if c.violation && math.Abs(r.Holding.MaxOver-c.over) > 1e-9 {
				t.Fatalf("over by %v, want %v", r.Holding.MaxOver, c.over)
			}
		})
	}
}

// TestHoldingCapBound: what a region holds may reach its cap plus one
// storage rounding and no more; when a smaller grant lowered the cap
// below what it held, it may keep what it held but not grow.
func TestHoldingCapBound(t *testing.T) {
	atCap := func(cap float64) float64 { return cap + holdTol }
	for _, c := range []struct {
		name      string
		first     *Bucket
		b         Bucket
		violation bool
		over      float64
	}{
		{"at the cap plus a rounding", nil, Bucket{NowUS: 1e6, Tokens: atCap(20), Cap: 20}, false, 0},
		{"tokens and leases at the cap", nil, Bucket{NowUS: 1e6, Tokens: 12, Outstanding: 8, Cap: 20}, false, 0},
		{"one over the cap", nil, Bucket{NowUS: 1e6, Tokens: 13, Outstanding: 8, Cap: 20}, true, 1},
		{"a hundredth over the cap", nil, Bucket{NowUS: 1e6, Tokens: 20.01, Cap: 20}, true, 0.01},
		{"cap lowered below what it held", &Bucket{NowUS: 1e6, Tokens: 4, Outstanding: 10, Cap: 20},
			Bucket{NowUS: 1e6, Tokens: 0, Outstanding: 14, Cap: 5}, false, 0},
		{"cap lowered, holding grown", &Bucket{NowUS: 1e6, Tokens: 4, Outstanding: 10, Cap: 20},
			Bucket{NowUS: 1e6, Tokens: 1, Outstanding: 14, Cap: 5}, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := oneKey(t, 10, 20, nil)
			if c.first != nil {
				o.BucketObserved(sec, 0, 0, *c.first)
			}
			o.BucketObserved(sec, 0, 0, c.b)
			r := o.Finish(2 * sec)
			if got := r.Holding.Violations != 0; got != c.violation {
				t.Fatalf("violation %v, want %v: %+v", got, c.violation, r.Holding)
			}
			if c.violation && math.Abs(r.Holding.MaxOver-c.over) > 2e-6 {
				t.Fatalf("over by %v, want %v", r.Holding.MaxOver, c.over)
			}
		})
	}
}

// TestRegionCheckKeepsTheFirstViolation: later violations count and may
// raise MaxOver but never replace the first one's time, key and region.
func TestRegionCheckKeepsTheFirstViolation(t *testing.T) {
	o := twoByTwo(t)
	o.BucketObserved(sec, 1, 1, Bucket{NowUS: 1e6, Tokens: 11, Cap: 10})
	o.BucketObserved(2*sec, 0, 0, Bucket{NowUS: 2e6, Tokens: 105, Cap: 100})
	o.BucketObserved(3*sec, 0, 1, Bucket{NowUS: 3e6, Tokens: 12, Cap: 10})
	r := o.Finish(4 * sec)
	h := r.Holding
	if h.Violations != 3 || h.FirstAt != sec || h.FirstKey != "v/c" || h.FirstRegion != "b" ||
		!strings.Contains(h.FirstDetail, "over cap 10") || math.Abs(h.MaxOver-5) > 1e-9 {
		t.Fatalf("holding %+v", h)
	}
}

// TestGrantOrderKeepsTheNewestIssue: a stale grant applied is a
// violation and does not become the reference: a grant issued between
// the two is still older than the newest applied.
func TestGrantOrderKeepsTheNewestIssue(t *testing.T) {
	o := twoByTwo(t)
	o.GrantIssued(sec, 1, 1, 2000)
	o.GrantIssued(sec, 0, 1, 500) // another region keeps its own order
	o.GrantIssued(sec, 1, 0, 100) // and another key
	o.GrantIssued(2*sec, 1, 1, 1000)
	o.GrantIssued(3*sec, 1, 1, 1500)
	o.GrantIssued(4*sec, 0, 1, 600)
	o.GrantIssued(4*sec, 1, 0, 200)
	r := o.Finish(5 * sec)
	g := r.GrantOrder
	if g.Checks != 7 || g.Violations != 2 || g.FirstAt != 2*sec || g.FirstKey != "v/c" || g.FirstRegion != "b" ||
		g.MaxOver != 0 || !strings.Contains(g.FirstDetail, "1000µs after one issued at 2000µs") {
		t.Fatalf("grant order %+v", g)
	}
	// A Redis that came back empty has applied nothing: any issue time is
	// new to it, the earliest too.
	o = twoByTwo(t)
	o.GrantIssued(sec, 1, 1, 2000)
	o.GrantIssued(sec, 0, 1, 2000)
	o.RedisDown(2*sec, 1)
	o.RedisUp(3*sec, 1)
	o.GrantIssued(4*sec, 1, 1, 0)
	o.GrantIssued(4*sec, 0, 1, 0)
	if g := o.Finish(5 * sec).GrantOrder; g.Violations != 1 || g.FirstRegion != "a" {
		t.Fatalf("after a restart: %+v", g)
	}
}

// TestObservationsRunDueChecksFirst: every observation first runs the
// checks that fell due before it (a grant expiring), so they are counted
// as the run goes, not only at Finish.
func TestObservationsRunDueChecksFirst(t *testing.T) {
	calls := map[string]func(o *Oracle){
		"BucketObserved": func(o *Oracle) { o.BucketObserved(6*sec, 0, 0, Bucket{NowUS: 6e6, Cap: 100}) },
		"GrantIssued":    func(o *Oracle) { o.GrantIssued(6*sec, 0, 0, 6e6) },
		"Decided":        func(o *Oracle) { o.Decided(6*sec, 0, 0, 1, SourceLease) },
		"Offered":        func(o *Oracle) { o.Offered(6*sec, 0, 0, 1, 1) },
		"CrashError":     func(o *Oracle) { o.CrashError(6*sec, 0, 1) },
		"StaticShares":   func(o *Oracle) { o.StaticShares(6*sec, 1, 0, 50, 100, 50, 100) },
		"StaticLease":    func(o *Oracle) { o.StaticLease(6*sec, 1, math.MaxInt64) },
		"RedisDown":      func(o *Oracle) { o.RedisDown(6*sec, 1) },
	}
	for name, call := range calls {
		o := twoRegions(t, nil)
		o.GrantApplied(sec, 0, 0, 30, 60, 5*sec)
		o.GrantApplied(sec, 1, 0, 70, 140, 8*sec)
		call(o)
		if o.res.Rates.Violations < 1 || o.res.Rates.FirstAt != 5*sec {
			t.Errorf("%s at 6s: the expiry at 5s not checked yet: %+v", name, o.res.Rates)
		}
	}
}

// TestBooksReportAnExcessOnceUntilItGrows: a bucket counting one decision
// more than the instances stays one over at every later call; that is one
// violation, and another only when the excess grows.
func TestBooksReportAnExcessOnceUntilItGrows(t *testing.T) {
	o := oneKey(t, 10, 20, nil)
	o.Decided(sec, 0, 0, 5, SourceLease)
	for i, adm := range []int64{6, 6, 6, 7, 7} {
		at := time.Duration(2+i) * sec
		o.BucketObserved(at, 0, 0, Bucket{NowUS: int64(at / time.Microsecond), Cap: 20, Admitted: adm})
	}
	r := o.Finish(10 * sec)
	if b := r.Books; b.Violations != 2 || b.MaxOver != 2 || b.FirstAt != 2*sec || b.Checks != 5 {
		t.Fatalf("one excess seen at 5 calls, grown once: want 2 violations, max 2, first at 2s: %+v", b)
	}
}

// TestStrictDecisionAnsweredAnErrorStaysUndelivered: a strict Check the
// region admitted whose caller got an error instead of the answer is
// denied to the caller and stays undelivered in the books, as one whose
// answer was lost: conservative, not a violation; and not a denial the
// instance decided, so a denial the bucket counts beside it is still seen.
func TestStrictDecisionAnsweredAnErrorStaysUndelivered(t *testing.T) {
	for _, c := range []struct {
		denied int64 // the bucket's denial counter
		want   int
	}{{0, 0}, {3, 0}, {4, 1}} {
		o := oneKey(t, 10, 20, nil)
		o.RegionPending(0, 0, 3) // the region's Check admitted 3
		o.Decided(sec, 0, 0, 3, SourceUnanswered)
		o.BucketObserved(2*sec, 0, 0, Bucket{NowUS: 2e6, Cap: 20, Admitted: 3, Denied: c.denied})
		r := o.Finish(3 * sec)
		if r.Books.Violations != c.want || r.Admitted != 0 || r.Denied != 3 {
			t.Fatalf("unanswered strict admission, bucket denied %d: want %d violations: books %+v, admitted %v, denied %v",
				c.denied, c.want, r.Books, r.Admitted, r.Denied)
		}
	}
}
