package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/memtest"
	"github.com/sluicehq/sluice/pkg/quota"
)

// pagingDaemon is a global-tier replica on real etcd, leading, with the
// options o (fuzzConfig unless o.Config is set: its hour-long epoch keeps
// the allocation loop from changing the state a test compares), and a
// gRPC client of it.
func pagingDaemon(t *testing.T, srv *etcdtest.Server, o DaemonOptions) (*Daemon, sluicev1.AllocatorServiceClient) {
	t.Helper()
	d, api := startPaging(t, srv, o)
	waitLeading(t, d)
	return d, api
}

// startPaging is pagingDaemon without waiting for the replica to lead.
func startPaging(t *testing.T, srv *etcdtest.Server, o DaemonOptions) (*Daemon, sluicev1.AllocatorServiceClient) {
	t.Helper()
	o.GRPCAddr, o.HTTPAddr, o.Prefix = "127.0.0.1:0", "off", "/paging"
	o.Etcd = srv.Client(t)
	o.Logger = slog.New(slog.DiscardHandler)
	o.DrainTimeout = 2 * time.Second
	if o.SessionTTL == 0 {
		o.SessionTTL = 60 * time.Second
	}
	if o.Config == nil {
		o.Config = StaticConfig{C: parseConfig(t, fuzzConfig)}
	}
	d, err := StartDaemon(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return d, sluicev1.NewAllocatorServiceClient(conn)
}

// waitLeading polls until d leads; an election on a fresh etcd is bounded
// by etcd's own request timeouts.
func waitLeading(t *testing.T, d *Daemon) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !d.Service.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("the replica never led")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

// pkey is key i's demand: tenant p<i>, class write.
func pkey(i int) *sluicev1.KeyDemand {
	return &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: fmt.Sprintf("p%d", i), Class: "write"}, Admitted: 5, WindowMs: 100}
}

// page is page p of n of region a's report of seq.
func page(seq uint64, p, n uint32, keys ...*sluicev1.KeyDemand) *sluicev1.RegionReport {
	return &sluicev1.RegionReport{Region: "a", Seq: seq, Page: p, Pages: n, Keys: keys}
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pageStep is one call and what it must get: an error of code with a
// message containing want, or (code OK) an acknowledgement of acked
// pages, or the answer when acked is 0. A step other than the last page
// of a report must change nothing the allocator holds.
type pageStep struct {
	name    string
	req     *sluicev1.RegionReport
	sync    bool // send with Sync rather than SyncPage
	code    codes.Code
	want    string
	acked   uint32
	changes bool
}

func runPageSteps(t *testing.T, d *Daemon, api sluicev1.AllocatorServiceClient, steps []pageStep) {
	t.Helper()
	for _, st := range steps {
		now := time.Now()
		before := d.Service.syncState(now)
		call := api.SyncPage
		if st.sync {
			call = api.Sync
		}
		resp, err := call(callCtx(t), st.req)
		got := status.Convert(err)
		if got.Code() != st.code || !strings.Contains(got.Message(), st.want) {
			t.Fatalf("%s: got %v, want %v containing %q", st.name, err, st.code, st.want)
		}
		if err == nil && resp.GetPagesReceived() != st.acked {
			t.Fatalf("%s: answered %v, want pages_received %d", st.name, resp, st.acked)
		}
		diff := before.diff(d.Service.syncState(now))
		switch {
		case !st.changes && diff != nil:
			t.Fatalf("%s: %v", st.name, diff)
		case st.changes && diff == nil:
			t.Fatalf("%s: the report changed nothing", st.name)
		}
	}
}

// tracked says whether the leader tracks key i (a report reached the
// allocator with it).
func tracked(d *Daemon, i int) bool {
	s := d.Service
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := namedKeys(s)[quota.Key{Tenant: fmt.Sprintf("p%d", i), Class: "write"}]
	return ok
}

// TestPagesAssembleOrRefuse drives SyncPage of a real replica over gRPC,
// two keys per page: pages out of order, missing, of another seq, with a
// different page count, with a bad key, or over the page's key bound are
// refused with a clear error and change nothing; a repeated page is
// acknowledged again; the last page runs the whole report once; a new
// seq's page 0 discards an unfinished report; a stale seq is refused; a
// report split into pages sent to Sync is refused; a report that names a
// key twice, in one page or in two, is refused whole at its last page.
func TestPagesAssembleOrRefuse(t *testing.T) {
	srv := etcdtest.Start(t)
	d, api := pagingDaemon(t, srv, DaemonOptions{MaxKeysPerPage: 2})
	bad := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: "p 9", Class: "write"}, WindowMs: 100}
	const restart = "send the report again from page 0"
	runPageSteps(t, d, api, []pageStep{
		{name: "pages to Sync", sync: true, req: page(1, 0, 3, pkey(0), pkey(1)), code: codes.InvalidArgument, want: "the pages of a report go to SyncPage"},
		{name: "page 1 first", req: page(1, 1, 3, pkey(2), pkey(3)), code: codes.Aborted, want: "no earlier page of it is held here"},
		{name: "page 0", req: page(1, 0, 3, pkey(0), pkey(1)), acked: 1},
		{name: "page 2 before 1", req: page(1, 2, 3, pkey(4)), code: codes.Aborted, want: "page 1 is the next one expected; " + restart},
		{name: "another page count", req: page(1, 1, 4, pkey(2), pkey(3)), code: codes.InvalidArgument, want: "says 4 pages, page 0 said 3"},
		{name: "bad key", req: page(1, 1, 3, pkey(2), bad), code: codes.InvalidArgument, want: "keys[3].key: invalid argument: tenant"},
		{name: "too many keys", req: page(1, 1, 3, pkey(2), pkey(3), pkey(4)), code: codes.InvalidArgument, want: "keys_per_report=2"},
		{name: "another seq mid-way", req: page(2, 1, 3, pkey(2), pkey(3)), code: codes.Aborted, want: "the report held here is seq 1; " + restart},
		{name: "page past the count", req: page(1, 3, 3), code: codes.InvalidArgument, want: "pages are numbered 0..pages-1"},
		{name: "answer before the report", req: &sluicev1.RegionReport{Region: "a", Seq: 1, AnswerPage: 1}, code: codes.Aborted, want: "no paged answer to seq 1 is held here"},
		// The first key of the bad pages above was not kept: page 1 again.
		{name: "page 1", req: page(1, 1, 3, pkey(2), pkey(3)), acked: 2},
		{name: "page 1 repeated", req: page(1, 1, 3, pkey(2), pkey(3)), acked: 2},
		{name: "last page", req: page(1, 2, 3, pkey(4)), changes: true},
		{name: "last page again", req: page(1, 2, 3, pkey(4)), code: codes.Aborted, want: "no earlier page of it is held here"},
		{name: "stale seq", req: page(0, 0, 2, pkey(0)), code: codes.Aborted, want: "seq 0 is below the last seen 1"},
		{name: "seq 2 page 0", req: page(2, 0, 2, pkey(5), pkey(6)), acked: 1},
		{name: "seq 3 page 0 discards seq 2", req: page(3, 0, 2, pkey(7)), acked: 1},
		{name: "seq 2 page 1", req: page(2, 1, 2, pkey(8)), code: codes.Aborted, want: "the report held here is seq 3"},
		{name: "seq 3 page 1", req: page(3, 1, 2, pkey(8)), changes: true},
	})
	for i := range 9 {
		if want := i != 5 && i != 6; tracked(d, i) != want {
			t.Errorf("key p%d tracked %v, want %v", i, !want, want)
		}
	}
	// A key of page 0 again in page 1, or twice in page 0: the report is
	// refused at its last page, whole, and changes nothing.
	runPageSteps(t, d, api, []pageStep{
		{name: "page 0", req: page(4, 0, 2, pkey(10), pkey(11)), acked: 1},
		{name: "a key of page 0 again", req: page(4, 1, 2, pkey(12), pkey(10)), code: codes.InvalidArgument, want: "report of seq 4 (2 pages): invalid argument: keys[3].key p10/write duplicates keys[0]"},
		{name: "the report is gone", req: page(4, 1, 2, pkey(12)), code: codes.Aborted, want: "no earlier page of it is held here"},
		{name: "a key twice in page 0", req: page(5, 0, 2, pkey(13), pkey(13)), acked: 1},
		{name: "its last page", req: page(5, 1, 2, pkey(14)), code: codes.InvalidArgument, want: "report of seq 5 (2 pages): invalid argument: keys[1].key p13/write duplicates keys[0]"},
	})
	for _, i := range []int{10, 11, 12, 13, 14} {
		if tracked(d, i) {
			t.Errorf("key p%d of a refused report is tracked", i)
		}
	}
}

// TestPagedReportOverTheByteBound: pages that would bring what the leader
// holds for a region past MaxReportBytes are refused, naming the bound,
// change nothing in the allocator, and the report's earlier pages are
// dropped; a report within the bound is taken.
func TestPagedReportOverTheByteBound(t *testing.T) {
	srv := etcdtest.Start(t)
	// Page 1 brings what is held to one byte over the bound.
	p0, p1 := page(1, 0, 2, pkey(0)), page(1, 1, 2, pkey(1), pkey(2), pkey(3))
	bound := proto.Size(p0) + proto.Size(p1) + 4*heldBytesPerKey - 1
	d, api := pagingDaemon(t, srv, DaemonOptions{MaxKeysPerPage: 3, MaxReportBytes: bound})
	runPageSteps(t, d, api, []pageStep{
		{name: "page 0", req: p0, acked: 1},
		{name: "page 1 over the bound", req: p1, code: codes.InvalidArgument, want: fmt.Sprintf("more than the bound report_bytes=%d", bound)},
		{name: "page 1 again: page 0 was dropped", req: p1, code: codes.Aborted, want: "no earlier page of it is held here"},
		{name: "within the bound", req: p0, acked: 1},
		{name: "within the bound, last page", req: page(1, 1, 2, pkey(2)), changes: true},
	})
}

// TestHeldBytesBoundTheHeap: what the leader counts against
// MaxReportBytes for the pages of a report in progress (heldBytes) is at
// least the heap they take: 40,000 keys held in pages of 10,000, all but
// the last sent.
func TestHeldBytesBoundTheHeap(t *testing.T) {
	n, perPage := 40_000, 10_000
	s, err := newService(serviceOptions{config: StaticConfig{C: parseConfig(t, fuzzConfig)}, advertise: "self:7500",
		maxKeys: perPage, logger: slog.New(slog.DiscardHandler)}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !s.promote(1, time.Now().Add(time.Hour), nil) {
		t.Fatal("promote refused")
	}
	rep := &sluicev1.RegionReport{Region: "a", Seq: 1}
	for i := range n {
		rep.Keys = append(rep.Keys, &sluicev1.KeyDemand{
			Key: &sluicev1.QuotaKey{Tenant: fmt.Sprintf("t%07d", i), Class: "write"}, Admitted: 1, WindowMs: 100,
		})
	}
	pages := splitReport(rep, perPage)
	pages = append(pages, pages[len(pages)-1]) // held: all but the last
	base := memtest.HeapAlloc()
	for _, p := range pages[:len(pages)-2] {
		// Each page as the server gets it: decoded from its own bytes.
		b, err := proto.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var got sluicev1.RegionReport
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if ack, err := s.SyncPage(t.Context(), &got); err != nil || ack.PagesReceived != got.Page+1 {
			t.Fatalf("page %d: %v, %v", got.Page, ack, err)
		}
	}
	heap := memtest.HeapAlloc() - base
	s.mu.Lock()
	held := s.pages.heldBytes()
	s.mu.Unlock()
	keys := n - perPage
	t.Logf("%d keys held: heap %+d bytes (%d per key), counted %d (%d per key)", keys, heap, heap/int64(keys), held, held/keys)
	if int64(held) < heap {
		t.Fatalf("the pages held take %d bytes of heap, more than the %d counted against the bound", heap, held)
	}
	runtime.KeepAlive(rep)
	runtime.KeepAlive(pages)
}

// TestPagedReportAfterConfigChange: a config change between two pages
// drops the pages held (they were checked against the old config) and
// refuses the next page with Aborted; the report sent again is taken.
func TestPagedReportAfterConfigChange(t *testing.T) {
	srv := etcdtest.Start(t)
	src := &memConfig{cfg: parseConfig(t, fuzzConfig)}
	d, api := pagingDaemon(t, srv, DaemonOptions{MaxKeysPerPage: 2, Config: src})
	runPageSteps(t, d, api, []pageStep{{name: "page 0", req: page(1, 0, 2, pkey(0), pkey(1)), acked: 1}})
	src.set(parseConfig(t, strings.Replace(fuzzConfig, "rate: 100/s", "rate: 200/s", 1)))
	runPageSteps(t, d, api, []pageStep{
		{name: "page 1 after the change", req: page(1, 1, 2, pkey(2)), code: codes.Aborted, want: "the config changed since its first pages were taken"},
		{name: "page 0 again", req: page(1, 0, 2, pkey(0), pkey(1)), acked: 1},
		{name: "page 1", req: page(1, 1, 2, pkey(2)), changes: true},
	})
}

// heldKeys are n keys holding a grant below their static share, which a
// learning leader (fuzzConfig's hour-long validity) hands back.
func heldKeys(n int) []*sluicev1.KeyDemand {
	keys := make([]*sluicev1.KeyDemand, n)
	for i := range keys {
		keys[i] = pkey(i)
		keys[i].HeldRate, keys[i].HeldBurst, keys[i].HeldValidMs, keys[i].Holding = 10, 10, 60_000, 5
	}
	return keys
}

// TestPagedAnswer: a report whose answer holds more grants than a page
// is answered in pages; Client fetches and assembles them into the answer
// one message would have carried, also on a retry of the seq (the
// allocator answers a seq it took with the same grants). answer_page out
// of range, or carrying keys, is refused.
func TestPagedAnswer(t *testing.T) {
	srv := etcdtest.Start(t)
	d, api := pagingDaemon(t, srv, DaemonOptions{MaxKeysPerPage: 10})
	c, err := NewClient([]string{d.GRPCAddr()}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetPageKeys(10)
	// Region b reports config revision 0; a's paged report names it in
	// its page 0: confirmed to both.
	if _, err := api.Sync(callCtx(t), &sluicev1.RegionReport{Region: "b", Seq: 1, ConfigRevisions: []int64{0}}); err != nil {
		t.Fatal(err)
	}
	const n = 35
	rep := &sluicev1.RegionReport{Region: "a", Seq: 7, Keys: heldKeys(n), ConfigRevisions: []int64{0}}
	for try := range 2 {
		ans, err := c.Sync(callCtx(t), rep)
		if err != nil {
			t.Fatalf("try %d: %v", try, err)
		}
		if len(ans.Grants) != n || ans.Seq != 7 || !ans.Learning || ans.Pages != 0 || !ans.ConfirmedKnown {
			t.Fatalf("try %d: answer of %d grants, seq %d, learning %v, pages %d, confirmed %v; want %d grants, seq 7, learning, unpaged, confirmed",
				try, len(ans.Grants), ans.Seq, ans.Learning, ans.Pages, ans.ConfirmedKnown, n)
		}
		for i, g := range ans.Grants {
			if g.Key.GetTenant() != fmt.Sprintf("p%d", i) {
				t.Fatalf("try %d: grants[%d] is for %v", try, i, g.Key)
			}
		}
	}
	first, err := api.SyncPage(callCtx(t), &sluicev1.RegionReport{Region: "a", Seq: 7, AnswerPage: 3})
	if err != nil || first.Page != 3 || first.Pages != 4 || len(first.Grants) != 5 {
		t.Fatalf("answer page 3: %v, %v; want the last 5 grants of 4 pages", first, err)
	}
	runPageSteps(t, d, api, []pageStep{
		{name: "answer page past the last", req: &sluicev1.RegionReport{Region: "a", Seq: 7, AnswerPage: 4}, code: codes.InvalidArgument, want: "the answer has pages 0..3"},
		{name: "answer page with keys", req: &sluicev1.RegionReport{Region: "a", Seq: 7, AnswerPage: 1, Keys: heldKeys(1)}, code: codes.InvalidArgument, want: "carries 1 keys, want none"},
		{name: "answer page of another seq", req: &sluicev1.RegionReport{Region: "a", Seq: 6, AnswerPage: 1}, code: codes.Aborted, want: "no paged answer to seq 6"},
	})
	// A report of one page is answered in one message, as by Sync.
	ans, err := c.Sync(callCtx(t), &sluicev1.RegionReport{Region: "a", Seq: 8, Keys: heldKeys(10)})
	if err != nil || len(ans.Grants) != 10 || ans.Pages != 0 {
		t.Fatalf("one page: %v, %v", ans, err)
	}
}

// TestPagedReportSurvivesFailover: the leader stops while a region's
// pages are in flight. A page sent on to the new leader is refused
// (Aborted: it holds no earlier page of the report) and changes nothing.
// Client, whose leader stops between its pages 0 and 1, sends the report
// again from page 0 to the new leader, which answers it whole.
func TestPagedReportSurvivesFailover(t *testing.T) {
	srv := etcdtest.Start(t)
	o := DaemonOptions{MaxKeysPerPage: 2, SessionTTL: 2 * time.Second}
	first, api1 := pagingDaemon(t, srv, o)
	second, api2 := startPaging(t, srv, o)
	for _, p := range []*sluicev1.RegionReport{page(1, 0, 3, pkey(0), pkey(1)), page(1, 1, 3, pkey(2), pkey(3))} {
		if _, err := api1.SyncPage(callCtx(t), p); err != nil {
			t.Fatal(err)
		}
	}
	first.Stop()
	waitLeading(t, second)
	runPageSteps(t, second, api2, []pageStep{
		{name: "last page to the new leader", req: page(1, 2, 3, pkey(4)), code: codes.Aborted, want: "no earlier page of it is held here"},
	})

	// Client: the leader (second) stops once page 0 was taken, before
	// page 1 leaves.
	third, _ := startPaging(t, srv, o)
	var page0s, stops int
	stopLeader := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*sluicev1.RegionReport); ok && strings.HasSuffix(method, "/SyncPage") && r.GetAnswerPage() == 0 {
			switch {
			case r.GetPage() == 0:
				page0s++
			case r.GetPage() == 1 && stops == 0:
				stops++
				second.Stop()
				waitLeading(t, third)
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := NewClient([]string{second.GRPCAddr(), third.GRPCAddr()},
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(stopLeader))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetPageKeys(2)
	// Long enough for the stop and the election the interceptor waits for.
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ans, err := c.Sync(ctx, &sluicev1.RegionReport{Region: "a", Seq: 2, Keys: heldKeys(5)})
	if err != nil {
		t.Fatalf("paged report across the failover: %v", err)
	}
	if page0s != 2 || stops != 1 {
		t.Fatalf("page 0 sent %d times, leader stopped %d times; want 2 and 1", page0s, stops)
	}
	if len(ans.Grants) != 5 || ans.Seq != 2 || !ans.Learning {
		t.Fatalf("answer from the new leader: %d grants, seq %d, learning %v; want 5, 2, true", len(ans.Grants), ans.Seq, ans.Learning)
	}
	if !tracked(third, 0) || !tracked(third, 4) {
		t.Fatal("the new leader does not track the report's keys")
	}
}

// TestPagedReportRefusedIsNotSentAgain: a paged report whose later page
// the leader refuses as invalid fails at once, after one try: Client
// sends a report again from page 0 only when the replica could not
// continue it, never when it refused what was sent.
func TestPagedReportRefusedIsNotSentAgain(t *testing.T) {
	srv := etcdtest.Start(t)
	d, _ := pagingDaemon(t, srv, DaemonOptions{MaxKeysPerPage: 2})
	c, err := NewClient([]string{d.GRPCAddr()}, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetPageKeys(2)
	bad := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: "p 9", Class: "write"}, WindowMs: 100}
	done := make(chan error, 1)
	go func() {
		_, err := c.Sync(callCtx(t), &sluicev1.RegionReport{Region: "a", Seq: 1, Keys: []*sluicev1.KeyDemand{pkey(0), pkey(1), bad}})
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(time.Minute): // one round trip on a working replica
		t.Fatal("Client still sending a report the leader refused")
	}
	if err == nil || !strings.Contains(err.Error(), "(1 tries)") || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Fatalf("a report whose page 1 is invalid: %v, want InvalidArgument after 1 try", err)
	}
}

// TestPagedReportGivesUpAfterThreeTries: a paged report whose later page
// the leader can never continue (it arrives as another seq's: Aborted) is
// sent from page 0 three times in all, then fails naming the tries and
// the leader's refusal.
func TestPagedReportGivesUpAfterThreeTries(t *testing.T) {
	srv := etcdtest.Start(t)
	d, _ := pagingDaemon(t, srv, DaemonOptions{MaxKeysPerPage: 2})
	var page0s int
	otherSeq := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*sluicev1.RegionReport); ok && strings.HasSuffix(method, "/SyncPage") && r.GetAnswerPage() == 0 {
			switch r.GetPage() {
			case 0:
				page0s++
			case 1:
				r = proto.Clone(r).(*sluicev1.RegionReport)
				r.Seq++
				req = r
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c, err := NewClient([]string{d.GRPCAddr()}, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(otherSeq))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetPageKeys(2)
	_, err = c.Sync(callCtx(t), &sluicev1.RegionReport{Region: "a", Seq: 1, Keys: heldKeys(3)})
	if err == nil || !strings.Contains(err.Error(), "(3 tries)") || !strings.Contains(err.Error(), "the report held here is seq 1") {
		t.Fatalf("a report whose page 1 the leader can never continue: %v, want Aborted after 3 tries", err)
	}
	if page0s != 3 {
		t.Fatalf("page 0 sent %d times, want 3", page0s)
	}
}
