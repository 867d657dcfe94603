package allocator

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestSyncPageChecksRegionAndLeadershipFirst: a page of a paged report,
// and a request for a page of a paged answer, are refused before anything
// is held or answered when the region is not configured
// (InvalidArgument) or when the replica does not lead (FailedPrecondition
// naming the leader it knows), also once it led and still holds the
// answer asked for.
func TestSyncPageChecksRegionAndLeadershipFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := newService(serviceOptions{config: StaticConfig{C: parseConfig(t, fuzzConfig)}, advertise: "self:7500",
			maxKeys: 2, logger: slog.New(slog.DiscardHandler)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		answer := func(region string, seq uint64, p uint32) *sluicev1.RegionReport {
			return &sluicev1.RegionReport{Region: region, Seq: seq, AnswerPage: p}
		}
		other := func(seq uint64, p, n uint32, keys ...*sluicev1.KeyDemand) *sluicev1.RegionReport {
			r := page(seq, p, n, keys...)
			r.Region = "nowhere"
			return r
		}
		type step struct {
			name string
			req  *sluicev1.RegionReport
			code codes.Code
			want string
		}
		run := func(steps []step) {
			t.Helper()
			for _, st := range steps {
				_, err := s.SyncPage(t.Context(), st.req)
				if got := status.Convert(err); got.Code() != st.code || !strings.Contains(got.Message(), st.want) {
					t.Fatalf("%s: %v, want %v containing %q", st.name, err, st.code, st.want)
				}
				s.mu.Lock()
				held := len(s.pages.inProgress)
				s.mu.Unlock()
				if held != 0 {
					t.Fatalf("%s: %d reports in progress held after a refusal", st.name, held)
				}
			}
		}

		s.observeLeader("leader:7500")
		run([]step{
			{"page 0 to a replica that never led", page(1, 0, 3, pkey(0), pkey(1)), codes.FailedPrecondition, "not leader; leader=leader:7500"},
			{"answer page to a replica that never led", answer("a", 1, 1), codes.FailedPrecondition, "not leader; leader=leader:7500"},
		})

		s.promote(1, time.Now().Add(time.Hour), nil)
		run([]step{
			{"page 0 of an unconfigured region", other(1, 0, 3, pkey(0), pkey(1)), codes.InvalidArgument, `region "nowhere" is not configured`},
			{"answer page of an unconfigured region", answer("nowhere", 1, 1), codes.InvalidArgument, `region "nowhere" is not configured`},
		})
		// A paged answer held, asked for once the replica no longer leads.
		keys := heldKeys(3)
		for p, keys := range [][]*sluicev1.KeyDemand{keys[:2], keys[2:]} {
			if _, err := s.SyncPage(t.Context(), page(1, uint32(p), 2, keys...)); err != nil {
				t.Fatalf("page %d: %v", p, err)
			}
		}
		if g, err := s.SyncPage(t.Context(), answer("a", 1, 1)); err != nil || len(g.GetGrants()) != 1 {
			t.Fatalf("answer page 1 while leading: %v, %v; want its one grant", g, err)
		}
		s.demote(1)
		run([]step{
			{"answer page held, no longer leading", answer("a", 1, 1), codes.FailedPrecondition, "not leader; leader=leader:7500"},
			{"page 0, no longer leading", page(2, 0, 3, pkey(0), pkey(1)), codes.FailedPrecondition, "not leader"},
		})
	})
}

// TestOnePageReportIsNotHeldAgainstReportBytes: SyncPage takes a report
// of one page (pages 0 or 1) as Sync takes it, whole, with no pages held
// and so nothing counted against report_bytes; page 0 of two pages is
// held and counted.
func TestOnePageReportIsNotHeldAgainstReportBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := newService(serviceOptions{config: StaticConfig{C: parseConfig(t, fuzzConfig)}, advertise: "self:7500",
			maxBytes: 1, logger: slog.New(slog.DiscardHandler)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.promote(1, time.Now().Add(time.Hour), nil)
		for seq, pages := range []uint32{0, 1} {
			if g, err := s.SyncPage(t.Context(), page(uint64(seq+1), 0, pages, heldKeys(2)...)); err != nil || len(g.GetGrants()) != 2 {
				t.Fatalf("page 0 of %d pages, report_bytes=1: %v, %v; want it answered whole", pages, g, err)
			}
		}
		if _, err := s.SyncPage(t.Context(), page(3, 0, 2, heldKeys(2)...)); status.Code(err) != codes.InvalidArgument ||
			!strings.Contains(err.Error(), "report_bytes=1") {
			t.Fatalf("page 0 of 2 pages, report_bytes=1: %v, want InvalidArgument naming the bound", err)
		}
	})
}

// TestPagedReportOfAnotherShardsKeyIsRefusedAtItsLastPage: shard 1 of 3
// takes the pages of a report naming a key shard 0 owns, then refuses the
// whole report at its last page with InvalidArgument naming the shard
// map: the region's seq is not taken and the pages are gone.
func TestPagedReportOfAnotherShardsKeyIsRefusedAtItsLastPage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := parseConfig(t, loopConfig+"global_shards: 3\n")
		s, err := newService(serviceOptions{config: StaticConfig{C: cfg}, advertise: "self:7500",
			maxKeys: 1, logger: slog.New(slog.DiscardHandler)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.sh.index = 1
		s.promote(1, time.Now().Add(time.Hour), nil)
		var mine, other *sluicev1.KeyDemand
		for i := 0; mine == nil || other == nil; i++ {
			k := quota.Key{Tenant: fmt.Sprintf("t%d", i), Class: "write"}
			kd := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, Admitted: 5, WindowMs: 100}
			switch cfg.ShardMap().Of(k) {
			case 1:
				mine = kd
			case 0:
				other = kd
			}
		}
		if ack, err := s.SyncPage(t.Context(), page(1, 0, 2, mine)); err != nil || ack.GetPagesReceived() != 1 {
			t.Fatalf("page 0 of shard 1's own key: %v, %v", ack, err)
		}
		_, err = s.SyncPage(t.Context(), page(1, 1, 2, other))
		if want := "belongs to shard 0 under the shard map"; status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), want) {
			t.Fatalf("last page of shard 0's key: %v, want InvalidArgument containing %q", err, want)
		}
		if _, ok := s.alloc.LastSeq("a"); ok {
			t.Fatal("a refused paged report's seq was taken")
		}
		if _, err := s.SyncPage(t.Context(), page(1, 1, 2, mine)); status.Code(err) != codes.Aborted {
			t.Fatalf("the last page again: %v, want Aborted (no page held)", err)
		}
	})
}
