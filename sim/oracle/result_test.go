package oracle

import "testing"

// TestPassNeedsEveryCheck: a clean run passes; one violation of any single
// check, and only that one, fails it.
func TestPassNeedsEveryCheck(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(o *Oracle)
		// violations of conformance, rates, bursts, holding, books, grant order
		want [6]int
	}{
		{"clean", func(o *Oracle) {
			o.Decided(0, 0, 0, 200, SourceLease)
			o.GrantApplied(sec, 0, 0, 50, 100, 5*sec)
			o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Tokens: 100, Cap: 100})
			o.GrantIssued(sec, 0, 0, 5)
		}, [6]int{}},
		{"conformance", func(o *Oracle) { o.Decided(0, 0, 0, 201, SourceLease) }, [6]int{1, 0, 0, 0, 0, 0}},
		{"rates", func(o *Oracle) { o.GrantApplied(sec, 0, 0, 51, 100, 5*sec) }, [6]int{0, 1, 0, 0, 0, 0}},
		{"bursts", func(o *Oracle) { o.GrantApplied(sec, 0, 0, 50, 101, 5*sec) }, [6]int{0, 0, 1, 0, 0, 0}},
		{"holding", func(o *Oracle) { o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Tokens: 101, Cap: 100}) }, [6]int{0, 0, 0, 1, 0, 0}},
		{"books", func(o *Oracle) { o.BucketObserved(sec, 0, 0, Bucket{NowUS: 1e6, Cap: 100, Admitted: 1}) }, [6]int{0, 0, 0, 0, 1, 0}},
		{"grant order", func(o *Oracle) { o.GrantIssued(sec, 0, 0, 5); o.GrantIssued(sec, 0, 0, 4) }, [6]int{0, 0, 0, 0, 0, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := twoRegions(t, nil)
			c.run(o)
			r := o.Finish(10 * sec)
			got := [6]int{r.Conformance.Violations, r.Rates.Violations, r.Bursts.Violations, r.Holding.Violations,
				r.Books.Violations, r.GrantOrder.Violations}
			if got != c.want {
				t.Fatalf("violations %v, want %v", got, c.want)
			}
			if pass := c.want == [6]int{}; r.Pass() != pass {
				t.Fatalf("Pass() = %v, want %v", r.Pass(), pass)
			}
		})
	}
}

// TestConvergedShiftIsNoMiss: a shift that converged at once (epoch 0) is
// not missed whatever the target; one not converged is missed by a
// target of at most the epochs it was watched; the digest gives the
// converged shifts' figures and the share held in percent.
func TestConvergedShiftIsNoMiss(t *testing.T) {
	cv := Convergence{Shifts: 2, Max: 0, P50: 0, Held: 0.875, NotConverged: 1, Horizon: 30, FirstMiss: "t/c at 40s",
		Each: []ShiftOutcome{{Key: "t/c", At: 10 * sec, Epochs: 0, Watched: 30}, {Key: "t/c", At: 40 * sec, Epochs: -1, Watched: 30}}}
	if m := []int{cv.Missed(0), cv.Missed(30), cv.Missed(31)}; m[0] != 1 || m[1] != 1 || m[2] != 0 {
		t.Fatalf("missed within 0, 30, 31 epochs: %v, want 1, 1, 0", m)
	}
	want := "max 0, median 0 epochs over 1 of 2 shifts; held within tolerance after: 87.50%; 1 not converged within 30 epochs (first t/c at 40s)"
	if got := cv.String(); got != want {
		t.Fatalf("text %q, want %q", got, want)
	}
}
