package allocator

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// Paged reports. A region report has no bound on its keys: one too large
// for a message (more than the keys of one page) is split into pages of
// one seq, sent in order to one replica with SyncPage. The leader decodes
// and checks each page as it arrives, keeps it until the last, then runs
// the whole report through the allocator once, as Sync does one message;
// the grants go back in pages of at most as many keys. See
// docs/architecture.md, "Paged reports".

const (
	// DefaultMaxReportBytes bounds the bytes the leader holds for one
	// region's report in progress (assembly.charge): about 800,000 keys
	// at MaxReportBytesPerKey, 1,100,000 with names of usual length.
	DefaultMaxReportBytes = 512 << 20
	// heldBytesPerKey is what the leader counts for each key it holds of
	// a report in progress, beside the wire bytes of its pages: the key's
	// decoded demand and limit. TestHeldBytesBoundTheHeap checks that the
	// count exceeds the heap the pages take.
	heldBytesPerKey = 384
	// MaxReportBytesPerKey is the most wire bytes one key adds to a
	// RegionReport (a KeyDemand: tenant and class at their length limits,
	// every number at its widest), MaxGrantBytesPerKey to RegionGrants (a
	// KeyGrant). TestWireBytesPerKey pins both.
	MaxReportBytesPerKey = 275
	MaxGrantBytesPerKey  = 229
)

// assembly is the pages of one region's report received so far.
type assembly struct {
	seq       uint64
	pages     uint32 // the report's page count
	next      uint32 // pages 0..next-1 are held
	cfg       *config.Config
	started   time.Time
	wire      int     // wire bytes of the pages held
	revisions []int64 // page 0's config_revisions
	// The pages' keys decoded, page by page (so that none is copied
	// before the last page), and their number.
	keys   [][]hierarchy.KeyDemand
	limits [][]hierarchy.KeyLimit
	nkeys  int
}

// pagedAnswer is the whole answer to a region's latest paged report, kept
// until its pages are fetched (answer_page) or the region reports again.
type pagedAnswer struct {
	seq   uint64
	pages uint32
	out   *sluicev1.RegionGrants
	at    time.Time
}

// pageBook is what the leader holds of paged reports, per region. The
// Service guards it with its mu.
type pageBook struct {
	inProgress map[string]*assembly
	answers    map[string]*pagedAnswer
}

// clear forgets everything held (a new term, or a replica that no longer
// leads: what regions sent an earlier term is not continued).
func (b *pageBook) clear() {
	b.inProgress, b.answers = nil, nil
}

// dropStale forgets reports in progress and answers older than maxAge: a
// report whose pages take that long to arrive answers nothing useful.
func (b *pageBook) dropStale(now time.Time, maxAge time.Duration) {
	for region, a := range b.inProgress {
		if now.Sub(a.started) > maxAge {
			delete(b.inProgress, region)
		}
	}
	for region, a := range b.answers {
		if now.Sub(a.at) > maxAge {
			delete(b.answers, region)
		}
	}
}

// charge is what the assembly counts against MaxReportBytes: the wire
// bytes of its pages and heldBytesPerKey for each key.
func (a *assembly) charge() int {
	return a.wire + heldBytesPerKey*a.nkeys
}

// report is the whole report the pages make, with each key's limit. A key
// named twice, in one page or in two, is the allocator's to refuse
// (hierarchy.Allocator.CheckReportKeys).
func (a *assembly) report(region string) (hierarchy.Report, []hierarchy.KeyLimit) {
	keys, limits := slices.Concat(a.keys...), slices.Concat(a.limits...)
	return hierarchy.Report{Region: region, Seq: a.seq, Keys: keys}, limits
}

// heldBytes is the bytes counted for every report in progress (for the
// metric).
func (b *pageBook) heldBytes() int {
	n := 0
	for _, a := range b.inProgress {
		n += a.charge()
	}
	return n
}

// SyncPage takes one page of a region report split into pages, or
// answers one page of the answer to such a report (answer_page). A report
// of one page (pages 0 or 1) is taken as Sync takes it.
func (s *Service) SyncPage(ctx context.Context, req *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.applyConfigLocked(now)
	if err := s.addressedLocked(req); err != nil {
		return nil, err
	}
	switch {
	case req.GetAnswerPage() > 0:
		return s.answerPageLocked(now, req)
	case req.GetPages() <= 1 && req.GetPage() == 0:
		return s.syncWholeLocked(now, req)
	}
	return s.pageLocked(now, req)
}

// pageLocked takes one page of a paged report: a page that is not the
// last is held and acknowledged (pages_received), the last runs the whole
// report and answers its first page of grants. A refused page changes
// nothing the allocator holds; see refusePage for what happens to the
// pages held. s.mu is held and the config applied.
func (s *Service) pageLocked(now time.Time, req *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	cfg := s.applied
	region, seq, page, pages := req.GetRegion(), req.GetSeq(), req.GetPage(), req.GetPages()
	label := regionLabel(cfg, region)
	invalid := func(format string, args ...any) error {
		s.m.report(label, "invalid")
		return status.Errorf(codes.InvalidArgument, "allocator: sync page: "+format, args...)
	}
	if err := regionsync.CheckReportHeader(cfg, req); err != nil {
		return nil, invalid("%v", err)
	}
	if err := checkSeqAhead(now, seq); err != nil {
		return nil, invalid("%v", err)
	}
	if page >= pages {
		return nil, invalid("page %d of a report of %d pages: pages are numbered 0..pages-1", page, pages)
	}
	if n := len(req.GetKeys()); n > s.maxKeys {
		return nil, invalid("page %d has %d keys, the limit is %d", page, n, s.maxKeys)
	}
	if ok, addr := s.leaderAt(now); !ok {
		s.m.report(label, "not_leader")
		return nil, notLeaderError(addr)
	}
	if last, ok := s.alloc.LastSeq(region); ok && seq < last {
		s.m.report(label, "stale")
		return nil, status.Errorf(codes.Aborted, "allocator: sync page: hierarchy: report from %q: %v: seq %d is below the last seen %d",
			region, hierarchy.ErrStaleReport, seq, last)
	}
	a, ack, err := s.nextAssemblyLocked(now, req)
	if err != nil || ack != nil {
		return ack, err
	}
	wire := proto.Size(req)
	if charge := a.charge() + wire + heldBytesPerKey*len(req.GetKeys()); charge > s.maxReportBytes {
		// The report can never be taken whole: what is held goes.
		delete(s.pages.inProgress, region)
		s.m.report(label, "invalid")
		return nil, status.Errorf(codes.InvalidArgument,
			"allocator: sync page: report of seq %d from %q: page %d brings what is held of it to %d bytes (its pages' wire bytes and %d per key), more than the bound report_bytes=%d a region's report may take; raise -max-report-bytes or report fewer keys",
			seq, region, page, charge, heldBytesPerKey, s.maxReportBytes)
	}
	// A key named twice is found once the last page is in.
	keys, limits, err := regionsync.DecodeKeys(cfg, req.GetKeys(), a.nkeys)
	if err != nil {
		return nil, invalid("page %d: %v", page, err)
	}
	a.keys, a.limits = append(a.keys, keys), append(a.limits, limits)
	a.nkeys += len(keys)
	a.wire += wire
	a.next = page + 1
	if s.pages.inProgress == nil {
		s.pages.inProgress = make(map[string]*assembly)
	}
	s.pages.inProgress[region] = a
	if a.next < a.pages {
		s.m.report(label, "page")
		return &sluicev1.RegionGrants{Region: region, Seq: seq, PagesReceived: a.next}, nil
	}
	delete(s.pages.inProgress, region)
	rep, limits := a.report(region)
	if err := s.alloc.CheckReportKeys(rep); err != nil {
		return nil, invalid("report of seq %d (%d pages): %v", seq, pages, err)
	}
	out, err := s.reportLocked(now, label, rep, limits, a.revisions)
	if err != nil {
		return nil, err
	}
	return s.firstAnswerPageLocked(now, out), nil
}

// nextAssemblyLocked is the assembly req's page goes into: a new one for
// page 0 (which starts the region's report over, whatever was held), else
// the one held for the same seq when req is its next page. A repeat of
// the page taken last (a retry whose answer was lost) is acknowledged
// again (ack) and changes nothing. Any other page is refused (Aborted,
// the region sends its report again from page 0) and changes nothing,
// except that the pages held are dropped when the config changed since
// they were decoded. s.mu is held.
func (s *Service) nextAssemblyLocked(now time.Time, req *sluicev1.RegionReport) (a *assembly, ack *sluicev1.RegionGrants, err error) {
	region, seq, page, pages := req.GetRegion(), req.GetSeq(), req.GetPage(), req.GetPages()
	label := regionLabel(s.applied, region)
	if page == 0 {
		delete(s.pages.inProgress, region)
		delete(s.pages.answers, region)
		return &assembly{seq: seq, pages: pages, cfg: s.applied, started: now, revisions: req.GetConfigRevisions()}, nil, nil
	}
	restart := func(why string) error {
		s.m.report(label, "page_out_of_order")
		return status.Errorf(codes.Aborted, "allocator: sync page: page %d of seq %d from %q: %s; send the report again from page 0",
			page, seq, region, why)
	}
	held := s.pages.inProgress[region]
	switch {
	case held == nil:
		return nil, nil, restart("no earlier page of it is held here (a leader change, or a page lost)")
	case held.seq != seq:
		return nil, nil, restart(fmt.Sprintf("the report held here is seq %d", held.seq))
	case held.pages != pages:
		s.m.report(label, "invalid")
		return nil, nil, status.Errorf(codes.InvalidArgument, "allocator: sync page: page %d of seq %d from %q says %d pages, page 0 said %d",
			page, seq, region, pages, held.pages)
	case held.cfg != s.applied:
		delete(s.pages.inProgress, region)
		return nil, nil, restart("the config changed since its first pages were taken")
	case page+1 == held.next:
		return nil, &sluicev1.RegionGrants{Region: region, Seq: seq, PagesReceived: held.next}, nil
	case page != held.next:
		return nil, nil, restart(fmt.Sprintf("page %d is the next one expected", held.next))
	}
	return held, nil, nil
}

// firstAnswerPageLocked is out when its grants fit one page; else out is
// kept for its other pages to be fetched, and its first page returned.
// s.mu is held.
func (s *Service) firstAnswerPageLocked(now time.Time, out *sluicev1.RegionGrants) *sluicev1.RegionGrants {
	n := len(out.Grants)
	if n <= s.maxKeys {
		if s.pages.answers != nil {
			delete(s.pages.answers, out.Region)
		}
		return out
	}
	pages := uint32((n + s.maxKeys - 1) / s.maxKeys)
	if s.pages.answers == nil {
		s.pages.answers = make(map[string]*pagedAnswer)
	}
	s.pages.answers[out.Region] = &pagedAnswer{seq: out.Seq, pages: pages, out: out, at: now}
	return answerPage(out, 0, pages, s.maxKeys)
}

// answerPageLocked answers a request for one page of the answer to the
// region's latest paged report. It changes nothing. s.mu is held and the
// config applied.
func (s *Service) answerPageLocked(now time.Time, req *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	region, seq, page := req.GetRegion(), req.GetSeq(), req.GetAnswerPage()
	label := regionLabel(s.applied, region)
	if err := regionsync.CheckReportHeader(s.applied, req); err != nil || len(req.GetKeys()) > 0 {
		s.m.report(label, "invalid")
		if err == nil {
			return nil, status.Errorf(codes.InvalidArgument, "allocator: sync page: a request for answer_page %d carries %d keys, want none",
				page, len(req.GetKeys()))
		}
		return nil, status.Error(codes.InvalidArgument, "allocator: sync page: "+err.Error())
	}
	if ok, addr := s.leaderAt(now); !ok {
		s.m.report(label, "not_leader")
		return nil, notLeaderError(addr)
	}
	a := s.pages.answers[region]
	if a == nil || a.seq != seq {
		s.m.report(label, "page_out_of_order")
		return nil, status.Errorf(codes.Aborted, "allocator: sync page: answer_page %d of seq %d from %q: no paged answer to seq %d is held here (a leader change, or a later report); send the report again from page 0",
			page, seq, region, seq)
	}
	if page >= a.pages {
		s.m.report(label, "invalid")
		return nil, status.Errorf(codes.InvalidArgument, "allocator: sync page: answer_page %d of seq %d: the answer has pages 0..%d",
			page, seq, a.pages-1)
	}
	return answerPage(a.out, page, a.pages, s.maxKeys), nil
}

// answerPage is page of out's grants, perPage of them, with out's other
// fields.
func answerPage(out *sluicev1.RegionGrants, page, pages uint32, perPage int) *sluicev1.RegionGrants {
	from := min(int(page)*perPage, len(out.Grants))
	to := min(from+perPage, len(out.Grants))
	return &sluicev1.RegionGrants{
		Region: out.Region, Seq: out.Seq, Grants: out.Grants[from:to:to],
		Learning: out.Learning, Epoch: out.Epoch, ReportAgainMs: out.ReportAgainMs,
		ConfirmedRevision: out.ConfirmedRevision, ConfirmedKnown: out.ConfirmedKnown,
		StaticLeaseMs: out.StaticLeaseMs, Page: page, Pages: pages,
	}
}
