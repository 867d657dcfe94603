package allocator

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestSplitReportPages: a report is cut into pages of at most n keys, in
// order, every page carrying the region, seq, its index and the page
// count; only page 0 carries the config revisions and the static lease. A
// report of no keys is one page.
func TestSplitReportPages(t *testing.T) {
	keys := func(n int) []*sluicev1.KeyDemand {
		out := make([]*sluicev1.KeyDemand, n)
		for i := range out {
			out[i] = pkey(i)
		}
		return out
	}
	for _, c := range []struct {
		keys, n int
		sizes   []int
	}{
		{0, 2, []int{0}},
		{1, 2, []int{1}},
		{2, 2, []int{2}},
		{3, 2, []int{2, 1}},
		{4, 2, []int{2, 2}},
		{5, 2, []int{2, 2, 1}},
		{3, 1, []int{1, 1, 1}},
		{3, 5, []int{3}},
	} {
		rep := &sluicev1.RegionReport{Region: "a", Seq: 9, Keys: keys(c.keys), ConfigRevisions: []int64{4, 5}, StaticValidMs: 700}
		pages := splitReport(rep, c.n)
		var sizes []int
		next := 0
		for i, p := range pages {
			sizes = append(sizes, len(p.GetKeys()))
			if p.GetRegion() != "a" || p.GetSeq() != 9 || p.GetPage() != uint32(i) || p.GetPages() != uint32(len(c.sizes)) {
				t.Errorf("%d keys in pages of %d: page %d is %v", c.keys, c.n, i, p)
			}
			for _, k := range p.GetKeys() {
				if want := fmt.Sprintf("p%d", next); k.GetKey().GetTenant() != want {
					t.Errorf("%d keys in pages of %d: page %d holds %s where %s comes", c.keys, c.n, i, k.GetKey().GetTenant(), want)
				}
				next++
			}
			if first := i == 0; first != (len(p.GetConfigRevisions()) == 2) || first != (p.GetStaticValidMs() == 700) {
				t.Errorf("%d keys in pages of %d: page %d carries revisions %v, static lease %dms", c.keys, c.n, i, p.GetConfigRevisions(), p.GetStaticValidMs())
			}
		}
		if fmt.Sprint(sizes) != fmt.Sprint(c.sizes) {
			t.Errorf("%d keys in pages of %d: pages of %v keys, want %v", c.keys, c.n, sizes, c.sizes)
		}
	}
}

// TestCheckPageAck: a page that is not the last must be acknowledged with
// its own seq and pages_received one past its index.
func TestCheckPageAck(t *testing.T) {
	p := &sluicev1.RegionReport{Region: "a", Seq: 4, Page: 1, Pages: 3}
	for _, c := range []struct {
		seq      uint64
		received uint32
		ok       bool
	}{
		{4, 2, true},
		{4, 1, false},
		{4, 3, false},
		{3, 2, false},
		{5, 2, false},
	} {
		err := checkPageAck(&sluicev1.RegionGrants{Region: "a", Seq: c.seq, PagesReceived: c.received}, p)
		if (err == nil) != c.ok {
			t.Errorf("page 1 of seq 4 acknowledged with seq %d, pages_received %d: %v, want ok %v", c.seq, c.received, err, c.ok)
		}
	}
}

// TestRestartable: a paged report is sent again from page 0 after a
// failure past page 0, unless the replica refused its content.
func TestRestartable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{pageError{status.Error(codes.Aborted, "x")}, true},
		{pageError{status.Error(codes.FailedPrecondition, "x")}, true},
		{pageError{status.Error(codes.Unavailable, "x")}, true},
		{fmt.Errorf("wrapped: %w", pageError{status.Error(codes.DeadlineExceeded, "x")}), true},
		{pageError{status.Error(codes.InvalidArgument, "x")}, false},
		{pageError{status.Error(codes.PermissionDenied, "x")}, false},
		{pageError{status.Error(codes.Unauthenticated, "x")}, false},
		{status.Error(codes.Aborted, "page 0"), false},
		{errors.New("page 0"), false},
	} {
		if got := restartable(c.err); got != c.want {
			t.Errorf("restartable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestFetchAnswerChecksItsFirstPage: an answer of one page is returned
// unpaged without another call; a first page of another seq, or not page
// 0, is an error.
func TestFetchAnswerChecksItsFirstPage(t *testing.T) {
	var c Client
	head := &sluicev1.RegionReport{Region: "a", Seq: 4, Page: 0, Pages: 2}
	for _, pages := range []uint32{0, 1} {
		first := &sluicev1.RegionGrants{Region: "a", Seq: 4, Page: 0, Pages: pages, Grants: []*sluicev1.KeyGrant{{Rate: 1}}}
		out, err := c.fetchAnswer(t.Context(), "nowhere:1", head, first)
		if err != nil || len(out.GetGrants()) != 1 || out.GetPage() != 0 || out.GetPages() != 0 {
			t.Errorf("an answer of %d pages: %v, %v; want it unpaged", pages, out, err)
		}
	}
	for _, first := range []*sluicev1.RegionGrants{
		{Region: "a", Seq: 3, Pages: 2},
		{Region: "a", Seq: 5, Pages: 2},
		{Region: "a", Seq: 4, Page: 1, Pages: 2},
	} {
		if out, err := c.fetchAnswer(t.Context(), "nowhere:1", head, first); err == nil || !strings.Contains(err.Error(), "the answer to seq 4 came as") {
			t.Errorf("first page %v: %v, %v; want an error", first, out, err)
		}
	}
}

// TestPageKeys: SetPageKeys sets the keys of one message; below 1 it
// restores the default.
func TestPageKeys(t *testing.T) {
	var c Client
	for _, c2 := range []struct{ set, want int }{{5, 5}, {1, 1}, {0, DefaultMaxKeysPerPage}, {-3, DefaultMaxKeysPerPage}} {
		c.SetPageKeys(c2.set)
		if got := c.pageSize(); got != c2.want {
			t.Errorf("SetPageKeys(%d): pages of %d keys, want %d", c2.set, got, c2.want)
		}
	}
}
