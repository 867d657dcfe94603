package allocator

import (
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
)

// newEdgeService is a Service of loopConfig (regions a and b) advertising
// self:7500, not yet leading.
func newEdgeService(t *testing.T) *Service {
	t.Helper()
	s, err := newService(serviceOptions{
		config: StaticConfig{C: parseConfig(t, loopConfig)}, advertise: "self:7500",
		logger: slog.New(slog.DiscardHandler),
	}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSyncTakesOnePageAndRefusesPaging: Sync takes a report that says it
// is page 0 of 1 as a whole one, and refuses a report of two pages or a
// request for answer page 1 (they go to SyncPage) with InvalidArgument,
// changing nothing.
func TestSyncTakesOnePageAndRefusesPaging(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newEdgeService(t)
		s.promote(1, time.Now().Add(time.Hour), nil)
		key := &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}
		rep := func(seq uint64, page, pages, answer uint32) *sluicev1.RegionReport {
			return &sluicev1.RegionReport{Region: "a", Seq: seq, Page: page, Pages: pages, AnswerPage: answer,
				Keys: []*sluicev1.KeyDemand{{Key: key, Admitted: 5, WindowMs: 100}}}
		}
		if g, err := s.Sync(t.Context(), rep(1, 0, 1, 0)); err != nil || g.GetSeq() != 1 {
			t.Fatalf("page 0 of 1 pages: %v, %v; want it taken whole", g, err)
		}
		for _, r := range []*sluicev1.RegionReport{rep(2, 0, 2, 0), rep(2, 1, 2, 0), rep(2, 0, 0, 1)} {
			_, err := s.Sync(t.Context(), r)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("page %d of %d, answer_page %d: %v, want InvalidArgument", r.Page, r.Pages, r.AnswerPage, err)
			}
		}
		if last, _ := s.alloc.LastSeq("a"); last != 1 {
			t.Fatalf("refused reports moved region a's seq to %d", last)
		}
	})
}

// TestStatusTopKeysBounds: Status lists DefaultStatusKeys keys when asked
// for 0, takes 1..MaxStatusKeys and refuses MaxStatusKeys+1 and negative
// counts with InvalidArgument.
func TestStatusTopKeysBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newEdgeService(t)
		s.promote(1, time.Now().Add(time.Hour), nil)
		var keys []*sluicev1.KeyDemand
		for i := range DefaultStatusKeys + 2 {
			keys = append(keys, &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: string(rune('a'+i)) + "x", Class: "write"}, Admitted: 5, WindowMs: 100})
		}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 1, Keys: keys}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			top  int32
			want int
		}{{0, DefaultStatusKeys}, {1, 1}, {DefaultStatusKeys + 2, DefaultStatusKeys + 2}, {MaxStatusKeys, DefaultStatusKeys + 2}} {
			st, err := s.Status(t.Context(), &sluicev1.StatusRequest{TopKeys: c.top})
			if err != nil || len(st.GetKeys()) != c.want {
				t.Errorf("top_keys %d: %d keys (%v), want %d", c.top, len(st.GetKeys()), err, c.want)
			}
		}
		for _, top := range []int32{MaxStatusKeys + 1, -1} {
			if _, err := s.Status(t.Context(), &sluicev1.StatusRequest{TopKeys: top}); status.Code(err) != codes.InvalidArgument {
				t.Errorf("top_keys %d: %v, want InvalidArgument", top, err)
			}
		}
	})
}

// TestLeadershipEndsAtItsDeadline: a replica grants strictly before its
// deadline and not at it; promote refuses a deadline already reached;
// only its own term's refreshes move the deadline, and only forward; only
// its own term's end demotes it. A replica that does not lead names the
// leader etcd last showed, never itself.
func TestLeadershipEndsAtItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newEdgeService(t)
		now := time.Now()
		if s.promote(1, now, nil) {
			t.Fatal("promote accepted a deadline already reached")
		}
		if ok, _ := s.leaderAt(now); ok {
			t.Fatal("leading after a refused promote")
		}
		deadline := now.Add(time.Second)
		if !s.promote(2, deadline, nil) {
			t.Fatal("promote refused a deadline in the future")
		}
		at := func(when time.Time) bool { ok, _ := s.leaderAt(when); return ok }
		if !at(deadline.Add(-time.Nanosecond)) || at(deadline) {
			t.Fatalf("leading just before the deadline %v, at it %v; want true, false", at(deadline.Add(-time.Nanosecond)), at(deadline))
		}
		// Another term's refresh, or an earlier deadline, moves nothing.
		s.extend(1, deadline.Add(time.Hour))
		s.extend(2, deadline.Add(-time.Millisecond))
		if at(deadline) || !at(deadline.Add(-time.Nanosecond)) {
			t.Fatal("a refresh of another term or an earlier deadline moved the deadline")
		}
		s.extend(2, deadline.Add(time.Second))
		if !at(deadline) || at(deadline.Add(time.Second)) {
			t.Fatal("its own term's later deadline did not move it exactly")
		}
		// Another term's end leaves it leading; its own ends it.
		s.demote(1)
		if !at(now) {
			t.Fatal("demoted by another term's end")
		}
		s.observeLeader("other:7500")
		s.demote(2)
		ok, addr := s.leaderAt(now)
		if ok || addr != "other:7500" {
			t.Fatalf("after its term ended: leading %v, leader %q; want false, other:7500", ok, addr)
		}
		s.observeLeader("self:7500")
		if ok, addr := s.leaderAt(now); ok || addr != "" {
			t.Fatalf("etcd last named this replica, which no longer leads: leading %v, leader %q; want false, \"\"", ok, addr)
		}
		// A later term's refresh of a replica that does not lead moves
		// nothing either.
		s.extend(2, now.Add(time.Hour))
		if at(now) {
			t.Fatal("a refresh after demotion made it lead again")
		}
	})
}

// TestPageBoundsAtTheirEdge: a page of exactly the keys a page may hold is
// taken and one more key is refused; pages that bring what is held of a
// report to exactly report_bytes are taken and one byte less refuses the
// last; an answer of exactly a page of grants comes unpaged.
func TestPageBoundsAtTheirEdge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		keys := heldKeys(3)
		p0, p1 := page(1, 0, 2, keys[0]), page(1, 1, 2, keys[1])
		exact := proto.Size(p0) + proto.Size(p1) + 2*heldBytesPerKey
		start := func(maxBytes int) *Service {
			s, err := newService(serviceOptions{config: StaticConfig{C: parseConfig(t, fuzzConfig)}, advertise: "self:7500",
				maxKeys: 2, maxBytes: maxBytes, logger: slog.New(slog.DiscardHandler)}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			s.promote(1, time.Now().Add(time.Hour), nil)
			return s
		}
		s := start(exact)
		if _, err := s.SyncPage(t.Context(), page(1, 0, 2, keys...)); status.Code(err) != codes.InvalidArgument ||
			!strings.Contains(err.Error(), "page 0 has 3 keys, the limit is 2") {
			t.Fatalf("a page of 3 keys, the limit 2: %v, want InvalidArgument", err)
		}
		if ack, err := s.SyncPage(t.Context(), page(1, 0, 2, keys[0], keys[1])); err != nil || ack.GetPagesReceived() != 1 {
			t.Fatalf("a page of 2 keys, the limit 2: %v, %v", ack, err)
		}
		// Over again from page 0, one key a page: exactly the bytes bound.
		if ack, err := s.SyncPage(t.Context(), p0); err != nil || ack.GetPagesReceived() != 1 {
			t.Fatalf("page 0: %v, %v", ack, err)
		}
		ans, err := s.SyncPage(t.Context(), p1)
		if err != nil || len(ans.GetGrants()) != 2 || ans.GetPages() != 0 || ans.GetPage() != 0 {
			t.Fatalf("last page at exactly report_bytes=%d: %v, %v; want 2 grants in one unpaged answer", exact, ans, err)
		}
		s.mu.Lock()
		kept := len(s.pages.answers)
		s.mu.Unlock()
		if kept != 0 {
			t.Fatalf("an answer of one page kept for answer_page requests (%d held)", kept)
		}

		s = start(exact - 1)
		if ack, err := s.SyncPage(t.Context(), p0); err != nil || ack.GetPagesReceived() != 1 {
			t.Fatalf("page 0: %v, %v", ack, err)
		}
		if _, err := s.SyncPage(t.Context(), p1); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "report_bytes") {
			t.Fatalf("last page one byte over report_bytes=%d: %v, want InvalidArgument", exact-1, err)
		}
	})
}

// TestReshardLearningEndsOnceEveryRegionRunsTheCount: a shard whose
// regions all report the revision its shard count took effect at stops
// learning once its election's learning is over; after the count changes
// it learns until every region reports the new revision, then one grant
// validity and one epoch more, and no longer.
func TestReshardLearningEndsOnceEveryRegionRunsTheCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 5)
		s := quietService(t, src)
		s.promote(1, time.Now().Add(time.Hour), nil)
		const epoch, validity = 100 * time.Millisecond, 500 * time.Millisecond
		seq := uint64(0)
		// report has both regions report rev and says whether the answer
		// was learning.
		report := func(rev int64) bool {
			seq++
			learning := false
			for _, region := range []string{"a", "b"} {
				g, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: region, Seq: seq, ConfigRevisions: []int64{rev}})
				if err != nil {
					t.Fatal(err)
				}
				learning = g.GetLearning()
			}
			return learning
		}
		// learnsFor reports rev every epoch until an answer is not
		// learning, and returns how long that took.
		learnsFor := func(rev int64) time.Duration {
			start := time.Now()
			for report(rev) {
				if time.Since(start) > 10*(validity+epoch) {
					t.Fatalf("still learning %v after every region reported revision %d", time.Since(start), rev)
				}
				time.Sleep(epoch)
			}
			return time.Since(start)
		}
		if took := learnsFor(5); took > validity {
			t.Fatalf("regions running the count's own revision kept the shard learning %v, past its election's %v", took, validity)
		}
		// global_shards 1 -> 2 at revision 6: learning while the regions
		// still run revision 5.
		src.Set(parseConfig(t, loopConfig+"global_shards: 2\n"), 6)
		for range 3 {
			if !report(5) {
				t.Fatal("not learning while the regions run the old shard count")
			}
			time.Sleep(epoch)
		}
		if took := learnsFor(6); took < validity || took > validity+2*epoch {
			t.Fatalf("learning ended %v after every region reported the new count's revision, want one validity and one epoch (%v)", took, validity+epoch)
		}
		// A later revision that keeps the count, run by every region (and
		// a report naming no revision): nothing moves, nothing learns.
		src.Set(parseConfig(t, strings.Replace(loopConfig, "rate: 100/s", "rate: 200/s", 1)+"global_shards: 2\n"), 7)
		seq++
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: seq}); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if report(7) {
				t.Fatal("learning after a change that keeps the shard count, every region running it")
			}
			time.Sleep(epoch)
		}
	})
}

// TestASeqFarAheadOfTheClockIsRefusedAndShutsNoRegionOut: a region report
// whose seq is more than MaxSeqAhead ahead of the allocator's clock (as
// microseconds since the epoch), whole or a page of one, is refused with
// InvalidArgument and not recorded, so the region's next report, numbered
// from its clock, is answered. Recorded, a seq near 2^64 made every later
// report of the region stale.
func TestASeqFarAheadOfTheClockIsRefusedAndShutsNoRegionOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newEdgeService(t)
		s.promote(1, time.Now().Add(time.Hour), nil)
		key := &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}
		rep := func(seq uint64, pages uint32) *sluicev1.RegionReport {
			return &sluicev1.RegionReport{Region: "a", Seq: seq, Pages: pages,
				Keys: []*sluicev1.KeyDemand{{Key: key, Admitted: 5, WindowMs: 100}}}
		}
		now := uint64(time.Now().UnixMicro())
		if _, err := s.Sync(t.Context(), rep(now, 0)); err != nil {
			t.Fatal(err)
		}
		limit := uint64(time.Now().Add(MaxSeqAhead).UnixMicro())
		for _, seq := range []uint64{limit + 1, 1<<64 - 6} {
			if _, err := s.Sync(t.Context(), rep(seq, 0)); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "ahead of this allocator's clock") {
				t.Errorf("seq %d: %v, want InvalidArgument naming the clock", seq, err)
			}
			if _, err := s.SyncPage(t.Context(), rep(seq, 2)); status.Code(err) != codes.InvalidArgument {
				t.Errorf("seq %d, page 0 of 2: %v, want InvalidArgument", seq, err)
			}
		}
		if last, _ := s.alloc.LastSeq("a"); last != now {
			t.Fatalf("refused reports moved region a's seq to %d", last)
		}
		if _, err := s.Sync(t.Context(), rep(now+1, 0)); err != nil {
			t.Fatalf("the region's next report after the refusals: %v", err)
		}
		if _, err := s.Sync(t.Context(), rep(limit, 0)); err != nil {
			t.Fatalf("a seq exactly MaxSeqAhead ahead: %v", err)
		}
	})
}
