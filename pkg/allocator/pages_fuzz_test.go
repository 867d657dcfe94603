package allocator

import (
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// pageOp turns three fuzz bytes into one SyncPage request of region a:
// seq 1..4; page and pages 0..7; 0..3 keys from 64 (a key of page 0
// again when the top bit of c is set); with the top bit of a, a request
// for an answer page instead.
func pageOp(a, b, c byte) *sluicev1.RegionReport {
	req := &sluicev1.RegionReport{Region: "a", Seq: 1 + uint64(a%4)}
	if a&0x80 != 0 {
		req.AnswerPage = uint32(b % 4)
		return req
	}
	req.Page, req.Pages = uint32(b&7), uint32(b>>3&7)
	start := int(c>>2) & 0x1f
	for j := range int(c % 4) {
		req.Keys = append(req.Keys, pkey(start+j))
	}
	if c&0x80 != 0 && len(req.Keys) > 0 {
		req.Keys[len(req.Keys)-1] = pkey(0)
	}
	return req
}

// FuzzPageAssembly sends sequences of pages (pageOp) to a leading Service:
// in any order, repeated, of several seqs, over the bytes bound. No
// sequence may crash it or fail inside it (Internal); a refused page,
// and a page taken but not the last, leave the allocator, its tracked
// keys and the regions' last reports exactly as they were; what it holds
// of reports in progress never exceeds the bytes bound; the keys of a
// last page taken are tracked.
func FuzzPageAssembly(f *testing.F) {
	for _, seed := range [][]byte{
		{0, 2<<3 | 0, 2, 0, 2<<3 | 1, 1<<2 | 1},                        // seq 1: page 0 of 2, page 1: taken
		{0, 3<<3 | 1, 1},                                               // page 1 with nothing held
		{0, 3<<3 | 0, 2, 0, 3<<3 | 2, 3<<2 | 1, 0, 3<<3 | 1, 2<<2 | 1}, // page 2 before 1, then 1
		{0, 2<<3 | 0, 2, 1, 2<<3 | 0, 3, 0, 2<<3 | 1, 1},               // seq 2 discards seq 1
		{0, 2<<3 | 0, 2, 0, 2<<3 | 1, 0x80 | 1},                        // a key of page 0 again
		{0, 2<<3 | 0, 3, 0, 2<<3 | 0, 3, 0, 2<<3 | 1, 4<<2 | 3},        // page 0 repeated, then over the bound
		{0, 0, 3, 0x80, 1, 0},                                          // whole report, then an answer page
	} {
		f.Add(seed)
	}
	s, err := newService(serviceOptions{config: StaticConfig{C: parseFuzzConfig(f)}, advertise: "self:7500",
		maxKeys: 3, maxBytes: 2000, logger: slog.New(slog.DiscardHandler)}, time.Now())
	if err != nil {
		f.Fatal(err)
	}
	if !s.promote(1, time.Now().Add(24*time.Hour), nil) {
		f.Fatal("promote refused")
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		for i := 0; i+2 < len(ops) && i < 3*64; i += 3 {
			req := pageOp(ops[i], ops[i+1], ops[i+2])
			now := time.Now()
			before := s.syncState(now)
			resp, err := s.SyncPage(t.Context(), req)
			st := status.Convert(err)
			switch st.Code() {
			case codes.OK:
			case codes.InvalidArgument, codes.Aborted:
				if strings.TrimSpace(st.Message()) == "" {
					t.Fatalf("%v refused without a message", req)
				}
			default:
				t.Fatalf("%v: unexpected answer %v", req, err)
			}
			ack := err == nil && resp.GetPagesReceived() > 0
			if err != nil || ack || req.GetAnswerPage() > 0 {
				if d := before.diff(s.syncState(now)); d != nil {
					t.Fatalf("%v answered %v, %v, but %v", req, resp, err, d)
				}
			}
			s.mu.Lock()
			held := s.pages.heldBytes()
			s.mu.Unlock()
			if held > s.maxReportBytes {
				t.Fatalf("holding %d bytes of pages, over the bound %d", held, s.maxReportBytes)
			}
			if err == nil && !ack && req.GetAnswerPage() == 0 {
				for _, kd := range req.GetKeys() {
					s.mu.Lock()
					_, ok := namedKeys(s)[quota.Key{Tenant: kd.GetKey().GetTenant(), Class: "write"}]
					s.mu.Unlock()
					if !ok {
						t.Fatalf("%v answered, but its key %v is not tracked", req, kd.GetKey())
					}
				}
			}
		}
	})
}

func parseFuzzConfig(f *testing.F) *config.Config {
	c, err := config.Parse([]byte(fuzzConfig))
	if err != nil {
		f.Fatal(err)
	}
	return c
}

// TestWireBytesPerKey pins the bytes one key adds on the wire at its
// widest (tenant and class at their length limits, every number at its
// widest valid value): MaxReportBytesPerKey to a RegionReport,
// MaxGrantBytesPerKey to RegionGrants; and that a page of the most keys
// with the widest header fits the message bound.
func TestWireBytesPerKey(t *testing.T) {
	key := &sluicev1.QuotaKey{Tenant: strings.Repeat("t", quota.MaxTenantLen), Class: strings.Repeat("c", quota.MaxClassLen)}
	kd := &sluicev1.KeyDemand{
		Key: key, Admitted: math.MaxInt64, Denied: math.MaxInt64, WindowMs: regionsync.MaxWireMillis,
		HeldRate: math.MaxFloat64, HeldBurst: math.MaxFloat64, HeldValidMs: regionsync.MaxWireMillis,
		Holding: math.MaxFloat64, DemandRate: proto.Float64(math.MaxFloat64),
	}
	kg := &sluicev1.KeyGrant{Key: key, Rate: math.MaxFloat64, Burst: math.MaxFloat64, ValidMs: regionsync.MaxWireMillis}
	reportHeader := &sluicev1.RegionReport{
		Region: strings.Repeat("r", quota.MaxTenantLen), Seq: math.MaxUint64, StaticValidMs: math.MaxInt64,
		ConfigRevisions: make([]int64, regionsync.MaxConfigs), Page: math.MaxUint32, Pages: math.MaxUint32, AnswerPage: math.MaxUint32,
	}
	for i := range reportHeader.ConfigRevisions {
		reportHeader.ConfigRevisions[i] = math.MaxInt64
	}
	grantsHeader := &sluicev1.RegionGrants{
		Region: reportHeader.Region, Seq: math.MaxUint64, Learning: true, Epoch: math.MaxUint64, ReportAgainMs: math.MaxInt64,
		ConfirmedRevision: math.MaxInt64, ConfirmedKnown: true, StaticLeaseMs: math.MaxInt64,
		Page: math.MaxUint32, Pages: math.MaxUint32, PagesReceived: math.MaxUint32,
	}
	report := proto.Clone(reportHeader).(*sluicev1.RegionReport)
	report.Keys = []*sluicev1.KeyDemand{kd}
	grants := proto.Clone(grantsHeader).(*sluicev1.RegionGrants)
	grants.Grants = []*sluicev1.KeyGrant{kg}
	perKey := proto.Size(report) - proto.Size(reportHeader)
	perGrant := proto.Size(grants) - proto.Size(grantsHeader)
	t.Logf("bytes per key: %d in a report (header %d), %d in an answer (header %d)",
		perKey, proto.Size(reportHeader), perGrant, proto.Size(grantsHeader))
	if perKey != MaxReportBytesPerKey || perGrant != MaxGrantBytesPerKey {
		t.Fatalf("a key takes %d bytes in a report, %d in an answer; MaxReportBytesPerKey %d, MaxGrantBytesPerKey %d say otherwise",
			perKey, perGrant, MaxReportBytesPerKey, MaxGrantBytesPerKey)
	}
	if n := DefaultMaxKeysPerPage*MaxReportBytesPerKey + proto.Size(reportHeader); n > maxMessageBytes {
		t.Fatalf("a full page takes up to %d bytes, over the message bound %d", n, maxMessageBytes)
	}
	if n := DefaultMaxKeysPerPage*MaxGrantBytesPerKey + proto.Size(grantsHeader); n > maxMessageBytes {
		t.Fatalf("a full answer page takes up to %d bytes, over the message bound %d", n, maxMessageBytes)
	}
	if DefaultMaxReportBytes < DefaultMaxKeysPerPage*(MaxReportBytesPerKey+heldBytesPerKey) {
		t.Fatalf("DefaultMaxReportBytes %d does not hold one full page", DefaultMaxReportBytes)
	}
}
