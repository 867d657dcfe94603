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
