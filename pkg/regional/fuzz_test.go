package regional_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
)

const fuzzConfig = `
lease_ttl: 5s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  read:   {mode: lease}
  export: {mode: strict, on_failure: closed, max_cost: 2}
tiers:
  free:
    read:   {rate: 0.151/s, burst: 3}
    export: {rate: 1000000000/s, burst: 1000000000}
default_tier: free
`

// The four LeaseService calls, chosen by the fuzz input's first argument.
const (
	opAcquire = iota
	opSync
	opRelease
	opCheck
	numOps
)

// leaseSeeds are valid and refused requests of every kind: the fuzzer
// mutates their wire bytes. testdata/fuzz/FuzzLeaseService holds the
// same, so `go test` runs them without the fuzzer.
func leaseSeeds() []struct {
	op  uint8
	msg proto.Message
} {
	rep := func(tenant, class string, seq uint64, mod func(*sluicev1.KeyReport)) *sluicev1.KeyReport {
		r := &sluicev1.KeyReport{Key: qk(tenant, class), Seq: seq, Want: 5, Min: 1}
		if mod != nil {
			mod(r)
		}
		return r
	}
	return []struct {
		op  uint8
		msg proto.Message
	}{
		{opAcquire, &sluicev1.AcquireRequest{InstanceId: "i1", Report: rep("acme", "read", 1, nil)}},
		{opAcquire, &sluicev1.AcquireRequest{InstanceId: "i1", Report: rep("ac}me", "read", 2, nil)}},
		{opAcquire, &sluicev1.AcquireRequest{InstanceId: "i1", Report: rep("acme", "read", 3, func(r *sluicev1.KeyReport) { r.Want = 1 << 40 })}},
		{opSync, &sluicev1.SyncRequest{InstanceId: "i1", Reports: []*sluicev1.KeyReport{
			rep("acme", "read", 4, func(r *sluicev1.KeyReport) { r.Used = 1; r.Returned = 1 }),
			rep("acme", "export", 5, nil)}}},
		{opSync, &sluicev1.SyncRequest{InstanceId: "i2", Reports: []*sluicev1.KeyReport{
			rep("acme", "read", 6, nil), rep("acme", "read", 7, nil)}}},
		{opRelease, &sluicev1.ReleaseRequest{InstanceId: "i1", Reports: []*sluicev1.KeyReport{
			rep("acme", "read", 8, func(r *sluicev1.KeyReport) { r.Want, r.Min, r.Used = 0, 0, 2 })}}},
		{opRelease, &sluicev1.ReleaseRequest{InstanceId: "i1", Reports: []*sluicev1.KeyReport{
			rep("acme", "read", 9, func(r *sluicev1.KeyReport) { r.Returned = -1 })}}},
		{opCheck, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 2}},
		{opCheck, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 3}},
		{opCheck, &sluicev1.CheckRequest{Key: qk("acme", "read"), Cost: 1}},
	}
}

// FuzzLeaseService sends arbitrary Acquire, Sync, Release and Check
// requests (decoded from fuzz bytes) to the real regional service over
// gRPC, on a real redis-server. No input may crash the service or make a
// script fail; an input refused as InvalidArgument leaves Redis byte for
// byte as it was (DUMP of every key, TTLs only ticking down).
func FuzzLeaseService(f *testing.F) {
	for _, s := range leaseSeeds() {
		b, err := proto.Marshal(s.msg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(s.op, b)
	}
	reg := regiontest.Start(f, regiontest.MustConfig(f, fuzzConfig), "local")
	client := sluicev1.NewLeaseServiceClient(reg.Dial(f))
	f.Fuzz(func(t *testing.T, op uint8, msg []byte) {
		var req proto.Message
		switch op % numOps {
		case opAcquire:
			req = &sluicev1.AcquireRequest{}
		case opSync:
			req = &sluicev1.SyncRequest{}
		case opRelease:
			req = &sluicev1.ReleaseRequest{}
		default:
			req = &sluicev1.CheckRequest{}
		}
		if err := proto.Unmarshal(msg, req); err != nil {
			return // not a message: gRPC would refuse it before the handler
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if n, err := reg.RDB.DBSize(ctx).Result(); err != nil {
			t.Fatal(err)
		} else if n > 200 {
			reg.RDB.FlushAll(ctx) // keep snapshots small; an empty Redis is a state too
		}
		before, err := redistest.Snapshot(ctx, reg.RDB)
		if err != nil {
			t.Fatal(err)
		}
		switch r := req.(type) {
		case *sluicev1.AcquireRequest:
			_, err = client.Acquire(ctx, r)
		case *sluicev1.SyncRequest:
			_, err = client.Sync(ctx, r)
		case *sluicev1.ReleaseRequest:
			_, err = client.Release(ctx, r)
		case *sluicev1.CheckRequest:
			_, err = client.Check(ctx, r)
		}
		checkRefusal(t, err, func() error {
			after, err := redistest.Snapshot(ctx, reg.RDB)
			if err != nil {
				t.Fatal(err)
			}
			return redistest.Unchanged(before, after)
		})
	})
}

// checkRefusal fails the test when err shows a crashed handler or a
// failed script, or when a refusal (InvalidArgument) has no message or
// changed Redis (changed returns why).
func checkRefusal(t *testing.T, err error, changed func() error) {
	t.Helper()
	st := status.Convert(err)
	switch st.Code() {
	case codes.OK, codes.Aborted, codes.FailedPrecondition, codes.ResourceExhausted:
	case codes.InvalidArgument:
		if strings.TrimSpace(st.Message()) == "" {
			t.Fatal("refused without a message")
		}
		if err := changed(); err != nil {
			t.Fatalf("refused (%s) but Redis changed: %v", st.Message(), err)
		}
	case codes.Unavailable, codes.DeadlineExceeded:
		// Redis is up: only a slow machine may time out; a script that
		// fails on what the input made it compute is a bug.
		if strings.Contains(st.Message(), "ERR") || strings.Contains(st.Message(), "script") {
			t.Fatalf("script failed on the input: %v", err)
		}
		t.Logf("slow: %v", err)
	default:
		t.Fatalf("unexpected answer: %v", err)
	}
}
