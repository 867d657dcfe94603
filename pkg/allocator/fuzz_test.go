package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
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
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// fuzzConfig has an epoch far longer than any fuzz run, so the allocation
// loop never steps while the fuzzer compares the state before and after
// one report: only Sync changes it.
const fuzzConfig = `
epoch: 1h
grant_validity: 4h
regions:
  a: {weight: 2}
  b: {weight: 1}
classes:
  write: {}
  tiny:  {max_cost: 1}
tiers:
  free:
    write: {rate: 100/s, burst: 100}
    tiny:  {rate: 0.151/s, burst: 1}
default_tier: free
`

// syncSeeds are valid reports and every report of BadReports: the fuzzer
// mutates their wire bytes. testdata/fuzz/FuzzAllocatorSync holds the
// same, so `go test` runs them without the fuzzer.
func syncSeeds() []*sluicev1.RegionReport {
	key := func(tenant, class string) *sluicev1.QuotaKey {
		return &sluicev1.QuotaKey{Tenant: tenant, Class: class}
	}
	seeds := []*sluicev1.RegionReport{
		{Region: "a", Seq: 1, Keys: []*sluicev1.KeyDemand{{Key: key("acme", "write"), Admitted: 100, WindowMs: 100}}},
		{Region: "b", Seq: 1, Keys: []*sluicev1.KeyDemand{
			{Key: key("acme", "write"), Admitted: 1, Denied: 3, WindowMs: 100, HeldRate: 50, HeldBurst: 50, HeldValidMs: 400, Holding: 20},
			{Key: key("acme", "tiny"), DemandRate: proto.Float64(1e300), WindowMs: 1}}},
		{Region: "a", Seq: 2, ConfigRevisions: []int64{0, 7}, Keys: []*sluicev1.KeyDemand{{Key: key("ac}me", "write"), Admitted: 1 << 62, WindowMs: 3_600_000}}},
		{Region: "a", Seq: 1, Keys: []*sluicev1.KeyDemand{{Key: key("stale", "write"), WindowMs: 100}}},
	}
	for _, b := range BadReports() {
		seeds = append(seeds, b.Report)
	}
	return seeds
}

// syncState is what a Sync may change: the allocator (its View at a fixed
// instant), the tracked keys and the regions' last accepted reports.
type syncState struct {
	view       hierarchy.View
	keys       map[quota.Key]time.Time
	lastReport map[string]time.Time
}

func (s *Service) syncState(now time.Time) syncState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return syncState{view: s.alloc.View(now), keys: namedKeys(s), lastReport: maps.Clone(s.lastReport)}
}

func (a syncState) diff(b syncState) error {
	switch {
	case !reflect.DeepEqual(a.view, b.view):
		return fmt.Errorf("allocator changed:\nbefore %+v\nafter  %+v", a.view, b.view)
	case !maps.Equal(a.keys, b.keys):
		return fmt.Errorf("tracked keys changed: %v -> %v", a.keys, b.keys)
	case !maps.Equal(a.lastReport, b.lastReport):
		return fmt.Errorf("last reports changed: %v -> %v", a.lastReport, b.lastReport)
	}
	return nil
}

// FuzzAllocatorSync sends arbitrary RegionReports (decoded from fuzz
// bytes) over gRPC to a real global-tier replica leading on a real
// embedded etcd. No input may crash the replica or fail inside it
// (Internal); a report refused as invalid (InvalidArgument) or stale
// (Aborted) leaves the allocator, its tracked keys and the regions' last
// reports exactly as they were.
func FuzzAllocatorSync(f *testing.F) {
	for _, r := range syncSeeds() {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	cfg, err := config.Parse([]byte(fuzzConfig))
	if err != nil {
		f.Fatal(err)
	}
	srv := etcdtest.Start(f)
	d, err := StartDaemon(context.Background(), DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", Etcd: srv.Client(f), Prefix: "/fuzz",
		SessionTTL: 60 * time.Second, Config: StaticConfig{C: cfg}, DrainTimeout: 2 * time.Second,
		MaxKeysPerPage: 64, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(d.Stop)
	// The replica campaigns at once; an election on a fresh etcd is
	// bounded by etcd's own request timeouts.
	deadline := time.Now().Add(30 * time.Second)
	for !d.Service.IsLeader() {
		if time.Now().After(deadline) {
			f.Fatal("the replica never led")
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	conn, err := grpc.NewClient(d.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conn.Close() })
	client := sluicev1.NewAllocatorServiceClient(conn)

	f.Fuzz(func(t *testing.T, msg []byte) {
		req := &sluicev1.RegionReport{}
		if err := proto.Unmarshal(msg, req); err != nil {
			return // not a message: gRPC would refuse it before the handler
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		now := time.Now()
		before := d.Service.syncState(now)
		_, err := client.Sync(ctx, req)
		st := status.Convert(err)
		switch st.Code() {
		case codes.OK:
		case codes.InvalidArgument, codes.Aborted:
			if strings.TrimSpace(st.Message()) == "" {
				t.Fatal("refused without a message")
			}
			if err := before.diff(d.Service.syncState(now)); err != nil {
				t.Fatalf("refused (%v) but %v", st.Code(), err)
			}
		case codes.DeadlineExceeded:
			t.Logf("slow: %v", err) // only a starved machine
		default:
			t.Fatalf("unexpected answer: %v", err)
		}
	})
}
