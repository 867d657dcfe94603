package oracle

import "testing"

// TestSumChecksAllowTheirTolerance: Σ rates may exceed r by 1e-9·r plus
// 1e-6 per region and Σ caps b by 1e-9·b plus 1e-6 per region, and no
// more (two regions, r = 100, b = 200: 2.1e-6 and 2.2e-6).
func TestSumChecksAllowTheirTolerance(t *testing.T) {
	for _, c := range []struct {
		name              string
		rateOver, capOver float64
		rates, bursts     int
	}{
		{"exactly the limits", 0, 0, 0, 0},
		{"within both tolerances", 2.05e-6, 2.15e-6, 0, 0},
		{"rate beyond its tolerance", 2.15e-6, 0, 1, 0},
		{"cap beyond its tolerance", 0, 2.25e-6, 0, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := twoRegions(t, nil)
			o.GrantApplied(sec, 0, 0, 50+c.rateOver, 100+c.capOver, 5*sec)
			r := o.Finish(2 * sec)
			if r.Rates.Violations != c.rates || r.Bursts.Violations != c.bursts {
				t.Fatalf("rate violations %d, cap violations %d: %+v %+v", r.Rates.Violations, r.Bursts.Violations, r.Rates, r.Bursts)
			}
		})
	}
}

// TestSumCheckFiguresAndExpiryChecks: the sums are checked when a grant
// applies and at each grant's expiry, once each; the largest ratios and
// the first violation's figures are reported.
func TestSumCheckFiguresAndExpiryChecks(t *testing.T) {
	o := twoRegions(t, nil)
	o.StaticShares(0, 0, 0, 20, 40, 20, 40)     // check 1: 70/100, 140/200
	o.GrantApplied(sec, 1, 0, 30, 60, 5*sec)    // 2: 50/100, 100/200
	o.GrantApplied(sec, 0, 0, 10, 20, 8*sec)    // 3: 40, 80; expiry timer stays at 5 s
	o.GrantApplied(2*sec, 1, 0, 85, 170, 5*sec) // 4: 95, 190
	// 5 (5 s): b back at 50: 60, 120. 6 (8 s): a back at 20: 70, 140.
	o.GrantApplied(9*sec, 0, 0, 60, 90, 20*sec)  // 7: 110, 190
	o.GrantApplied(9*sec, 1, 0, 40, 110, 20*sec) // 8: 100, 200
	r := o.Finish(30 * sec)                      // 9 (20 s): 70, 140
	if r.Rates.Checks != 9 || r.Bursts.Checks != 9 || r.GrantsApplied != 5 {
		t.Fatalf("checks %d/%d, grants %d: want 9 checks of 5 grants", r.Rates.Checks, r.Bursts.Checks, r.GrantsApplied)
	}
	if r.Rates.MaxRatio != 1.1 || r.Bursts.MaxRatio != 1 {
		t.Fatalf("max ratios %v %v", r.Rates.MaxRatio, r.Bursts.MaxRatio)
	}
	if r.Rates.Violations != 1 || r.Rates.FirstAt != 9*sec || r.Rates.FirstSum != 110 || r.Rates.FirstLimit != 100 ||
		r.Rates.FirstKey != "t/c" || r.Bursts.Violations != 0 {
		t.Fatalf("rates %+v bursts %+v", r.Rates, r.Bursts)
	}
	if want := "a 60/s burst 90 (grant until 20s), b 50/s burst 100 (static share)"; r.Rates.FirstParts != want {
		t.Fatalf("first violation's parts %q, want %q", r.Rates.FirstParts, want)
	}
}

// TestExpiryCheckedOnceWhenAnEarlierOneIsArmedLater: a grant ending
// earlier than the expiry already armed is applied after it; each instant
// is still checked once (the timer of the later expiry, left queued, does
// not check it a second time beside the one armed again after the
// earlier expiry).
func TestExpiryCheckedOnceWhenAnEarlierOneIsArmedLater(t *testing.T) {
	o := twoRegions(t, nil)
	o.GrantApplied(sec, 0, 0, 70, 100, 9*sec)    // check 1: 120 (b at its static 50): over; 9 s armed
	o.GrantApplied(2*sec, 1, 0, 30, 100, 5*sec)  // 2: 100; 5 s armed, the 9 s timer left queued
	o.GrantApplied(3*sec, 1, 0, 30, 100, 12*sec) // 3: 100
	// 4 (5 s): 100, and 9 s armed again. 5 (9 s): a back at 50: 80.
	r := o.Finish(20 * sec) // 6 (12 s): 100
	if r.Rates.Checks != 6 || r.Rates.Violations != 1 || r.Rates.FirstAt != sec {
		t.Fatalf("rates %+v: want 6 checks and the one violation at 1s", r.Rates)
	}
}

// TestRedisOutageAndRestart: a region whose Redis is down refills at
// nothing, so the others may use the whole rate; back empty, it has lost
// its grants and its static lease and runs on its floors until a static
// lease is stored again.
func TestRedisOutageAndRestart(t *testing.T) {
	o := twoRegions(t, func(s *Setup) {
		s.Keys[0].FloorRate, s.Keys[0].FloorBurst = []float64{10, 10}, []float64{20, 20}
	})
	o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Tokens: 0, Cap: 100})
	o.GrantApplied(sec, 0, 0, 50, 100, 20*sec)
	o.RedisDown(2*sec, 0)
	o.GrantApplied(3*sec, 1, 0, 100, 200, 20*sec)
	if o.res.Rates.Violations != 0 || o.res.Bursts.Violations != 0 {
		t.Fatalf("the whole rate beside a region whose Redis is down flagged: %+v", o.res.Rates)
	}
	o.GrantApplied(4*sec, 1, 0, 90, 180, 20*sec)
	o.RedisUp(5*sec, 0) // a: floor 10 + b's 90
	// A restarted Redis holds new buckets: a full one is not judged by the
	// one before.
	o.BucketObserved(5*sec, 0, 0, Bucket{NowUS: 1e6, Tokens: 20, Cap: 20})
	if o.res.Rates.Violations != 0 || o.res.Bursts.Violations != 0 || o.res.Holding.Violations != 0 {
		t.Fatalf("back on its floor flagged: %+v %+v %+v", o.res.Rates, o.res.Bursts, o.res.Holding)
	}
	o.GrantApplied(6*sec, 1, 0, 91, 181, 20*sec)
	if o.res.Rates.Violations != 1 || o.res.Bursts.Violations != 1 {
		t.Fatalf("a region back up not counted: %+v", o.res.Rates)
	}
	o.StaticLease(7*sec, 0, 30*sec) // its static share again: 50 + 91
	if o.res.Rates.Violations != 2 || o.res.Rates.FirstAt != 6*sec {
		t.Fatalf("static lease after the restart not counted: %+v", o.res.Rates)
	}
	// The same lease again changes nothing and checks nothing.
	checks := o.res.Rates.Checks
	o.StaticLease(8*sec, 0, 30*sec)
	if o.res.Rates.Checks != checks {
		t.Fatalf("a repeated static lease checked again")
	}
}

// TestRedisBackAtTheStartRunsOnItsFloors: a Redis back empty has no
// static lease from the instant it is back, the run's first too: beside
// it the others may use all but its floors.
func TestRedisBackAtTheStartRunsOnItsFloors(t *testing.T) {
	o := twoRegions(t, func(s *Setup) {
		s.Keys[0].FloorRate, s.Keys[0].FloorBurst = []float64{10, 10}, []float64{20, 20}
	})
	o.RedisDown(0, 0)
	o.RedisUp(0, 0)
	o.GrantApplied(0, 1, 0, 90, 180, 10*sec)
	if r := o.Finish(sec); r.Rates.Violations != 0 || r.Bursts.Violations != 0 || r.Rates.MaxRatio != 1 || r.Bursts.MaxRatio != 1 {
		t.Fatalf("floor 10/20 beside 90/180 judged against its static share: %+v %+v", r.Rates, r.Bursts)
	}
}

// TestCrashErrorAccounting: ε adds up per key; zero or negative amounts
// are ignored; CrashKeys counts keys with any.
func TestCrashErrorAccounting(t *testing.T) {
	o := twoByTwo(t)
	o.CrashError(sec, 0, 0)
	o.CrashError(sec, 0, -3)
	if c := o.res.Conformance; c.CrashKeys != 0 || c.CrashError != 0 {
		t.Fatalf("nothing counted as a crash error: %+v", c)
	}
	o.CrashError(sec, 1, 2)
	o.CrashError(2*sec, 1, 1.5)
	o.CrashError(2*sec, 0, 4)
	o.CrashError(2*sec, 0, -4)
	c := o.Finish(3 * sec).Conformance
	if c.CrashKeys != 2 || c.CrashError != 7.5 {
		t.Fatalf("crash errors: %+v", c)
	}
	if o.keys[0].eps != 4 || o.keys[1].eps != 3.5 {
		t.Fatalf("ε per key %v %v", o.keys[0].eps, o.keys[1].eps)
	}
}

// TestConformanceEpisodesAndEpsilon: b = 200, r = 100, ε = 5. A batch
// exactly at b + ε is covered by ε; one token over is a violation of one
// token; consecutive batches over are one episode, ended by any batch
// within b + ε.
func TestConformanceEpisodesAndEpsilon(t *testing.T) {
	o := twoByTwo(t)
	o.CrashError(0, 0, 5)
	o.Decided(0, 0, 0, 205, SourceLease)     // level 205: covered
	o.Decided(sec, 1, 0, 100, SourceStrict)  // 205: covered
	o.Decided(sec, 0, 0, 1, SourceLease)     // 206: violation 1
	o.Decided(sec, 0, 0, 2, SourceLease)     // 208: same episode
	o.Decided(2*sec, 0, 0, 97, SourceLease)  // 205: covered, episode ends
	o.Decided(2*sec, 0, 0, 1, SourceLease)   // 206: violation 2
	o.Decided(4*sec, 0, 0, 6, SourceLease)   // 12: below b, episode ends
	o.Decided(4*sec, 0, 0, 194, SourceLease) // 206: violation 3
	o.Decided(5*sec, 1, 1, 21, SourceLease)  // other key, no ε: 1 over, violation 4
	c := o.Finish(10 * sec).Conformance
	if c.Checks != 9 || c.Violations != 4 || c.CoveredByEps != 3 || c.FirstAt != sec || c.FirstKey != "u/c" {
		t.Fatalf("episodes: %+v", c)
	}
	if c.MaxExcess != 3 || c.WorstKey != "u/c" || c.MaxExcessRaw != 8 || c.MaxExcessWithDegraded != 8 {
		t.Fatalf("excess figures: %+v", c)
	}
	o = twoByTwo(t)
	o.Decided(0, 0, 1, 20, SourceLease)
	o.Decided(0, 0, 0, 202, SourceLease)
	o.Decided(0, 1, 1, 4, SourceLease)
	if c := o.Finish(sec).Conformance; c.Violations != 2 || c.MaxExcess != 4 || c.WorstKey != "v/c" || c.FirstKey != "u/c" {
		t.Fatalf("worst key: %+v", c)
	}
}

// TestDecisionsBySource: every source lands in its own total; shadow
// admissions may be counted by the bucket as admitted or denied and are
// not admissions; degraded ones are admissions the bucket never saw and
// outside invariant 1.
func TestDecisionsBySource(t *testing.T) {
	o := twoByTwo(t)
	o.Decided(sec, 0, 0, 150, SourceLease)
	o.Decided(sec, 0, 0, 40, SourceStrict)
	o.Decided(sec, 0, 0, 300, SourceDegraded)
	o.Decided(sec, 0, 0, 7, SourceShadow)
	o.Decided(sec, 0, 0, 11, SourceDenied)
	o.Unserved(sec, 1, 0, 13)
	o.Decided(sec, 1, 1, 0, SourceLease)
	r := o.Finish(2 * sec)
	if r.Admitted != 490 || r.Strict != 40 || r.Degraded != 300 || r.Shadow != 7 || r.Denied != 24 || r.Unserved != 13 {
		t.Fatalf("totals: admitted %v strict %v degraded %v shadow %v denied %v unserved %v",
			r.Admitted, r.Strict, r.Degraded, r.Shadow, r.Denied, r.Unserved)
	}
	c := r.Conformance
	if c.Checks != 2 || c.Violations != 0 || c.MaxExcessRaw != 0 || c.MaxExcessWithDegraded != 290 {
		t.Fatalf("conformance: %+v", c)
	}
	for _, bc := range []struct {
		name      string
		adm, den  int64
		violation bool
	}{
		{"lease, strict and shadow admitted", 197, 11, false},
		{"shadow as denied", 190, 18, false},
		{"one more admission", 198, 11, true},
		{"degraded counted by the bucket", 497, 11, true},
		{"one more denial", 190, 19, true},
	} {
		o := twoByTwo(t)
		o.Decided(sec, 0, 0, 150, SourceLease)
		o.Decided(sec, 0, 0, 40, SourceStrict)
		o.Decided(sec, 0, 0, 300, SourceDegraded)
		o.Decided(sec, 0, 0, 7, SourceShadow)
		o.Decided(sec, 0, 0, 11, SourceDenied)
		o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Cap: 100, Admitted: bc.adm, Denied: bc.den})
		if got := o.Finish(2*sec).Books.Violations != 0; got != bc.violation {
			t.Errorf("%s: violation %v, want %v", bc.name, got, bc.violation)
		}
	}
}

// TestReclaimTakesTheLongest: the reclaim time reported is the longest
// crash-to-reclaimed span.
func TestReclaimTakesTheLongest(t *testing.T) {
	o := twoRegions(t, nil)
	o.Reclaimed(10*sec, 13*sec, 1)
	o.Reclaimed(20*sec, 21*sec, 2)
	o.Reclaimed(30*sec, 33*sec+1, 0.5)
	if r := o.Finish(40 * sec).Reclaim; r.Max != 3*sec+1 || r.Crashes != 3 || r.Tokens != 3.5 {
		t.Fatalf("reclaim %+v", r)
	}
}

// TestWorstKeyIsTheFirstWithTheLargestExcess: a later key only as far
// over does not take the worst key's place.
func TestWorstKeyIsTheFirstWithTheLargestExcess(t *testing.T) {
	o := twoByTwo(t)
	o.Decided(0, 1, 1, 21, SourceLease)
	o.Decided(0, 0, 0, 201, SourceLease)
	if c := o.Finish(sec).Conformance; c.Violations != 2 || c.MaxExcess != 1 || c.WorstKey != "v/c" {
		t.Fatalf("worst key: %+v", c)
	}
}
