package allocator

import (
	"log/slog"
	"maps"
	"math"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// TestBadReportsChangeNothing builds allocator state from valid reports,
// then sends every bad report: each is refused with InvalidArgument naming
// the field, and the allocator (its View at the same instant) and the
// tracked keys are exactly as before. Virtual time keeps the instant fixed.
func TestBadReportsChangeNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := newService(serviceOptions{
			config: StaticConfig{C: parseConfig(t, loopConfig)}, advertise: "self:7500",
			maxKeys: 4, logger: slog.New(slog.DiscardHandler),
		}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		s.promote(1, time.Now().Add(time.Hour), nil)
		key := &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}
		for seq := uint64(1); seq <= 10; seq++ {
			for _, r := range []struct {
				region   string
				admitted int64
			}{{"a", 100}, {"b", 1}} {
				if _, err := s.Sync(ctx, &sluicev1.RegionReport{Region: r.region, Seq: seq, Keys: []*sluicev1.KeyDemand{{
					Key: key, Admitted: r.admitted, WindowMs: 100,
				}}}); err != nil {
					t.Fatalf("valid report: %v", err)
				}
			}
			time.Sleep(100 * time.Millisecond)
			s.step(time.Now())
		}
		now := time.Now()
		before := s.View(now)
		if len(before.Keys) != 1 || !before.Keys[0].Contended {
			t.Fatalf("setup: want one contended key, got %+v", before.Keys)
		}
		keysBefore := namedKeys(s)

		bad := BadReports()
		tooMany := &sluicev1.RegionReport{Region: "a", Seq: 99}
		for range 5 {
			tooMany.Keys = append(tooMany.Keys, &sluicev1.KeyDemand{Key: key, WindowMs: 100})
		}
		bad = append(bad, BadReport{"too many keys", tooMany, "keys has 5 entries, the limit is 4"})
		for _, c := range bad {
			_, err := s.Sync(ctx, c.Report)
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.Want) {
				t.Errorf("%s: got %v, want InvalidArgument containing %q", c.Name, err, c.Want)
			}
		}
		if after := s.View(now); !reflect.DeepEqual(before, after) {
			t.Errorf("bad reports changed the allocator:\nbefore %+v\nafter  %+v", before, after)
		}
		if !maps.Equal(keysBefore, namedKeys(s)) {
			t.Errorf("bad reports changed the tracked keys: %v -> %v", keysBefore, namedKeys(s))
		}

		// A retry gets the same answer; an older report is refused as
		// stale and changes nothing either.
		retry := &sluicev1.RegionReport{Region: "a", Seq: 10, Keys: []*sluicev1.KeyDemand{{Key: key, Admitted: 100, WindowMs: 100}}}
		first, err := s.Sync(ctx, retry)
		if err != nil {
			t.Fatal(err)
		}
		second, err := s.Sync(ctx, retry)
		if err != nil || !reflect.DeepEqual(first.Grants, second.Grants) {
			t.Fatalf("retry answered differently: %v / %v, %v", first.Grants, second.Grants, err)
		}
		retry.Seq = 9
		if _, err := s.Sync(ctx, retry); status.Code(err) != codes.Aborted {
			t.Fatalf("stale report: %v, want Aborted", err)
		}
	})
}

// TestIdleKeysAreForgotten checks that a key nobody reports is dropped
// from the allocator only after every grant for it has expired.
func TestIdleKeysAreForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := newService(serviceOptions{
			config: StaticConfig{C: parseConfig(t, loopConfig)}, logger: slog.New(slog.DiscardHandler),
		}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.promote(1, time.Now().Add(time.Hour), nil)
		key := &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}
		if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: "a", Seq: 1, Keys: []*sluicev1.KeyDemand{{
			Key: key, Admitted: 100, WindowMs: 100,
		}}}); err != nil {
			t.Fatal(err)
		}
		last := time.Now()
		// Two validities and two epochs: 1.2s with this config.
		horizon := 1200 * time.Millisecond
		for time.Since(last) <= horizon {
			time.Sleep(100 * time.Millisecond)
			s.step(time.Now())
			if time.Since(last) <= horizon && len(namedKeys(s)) != 1 {
				t.Fatalf("key forgotten %v after it was last reported", time.Since(last))
			}
		}
		if len(namedKeys(s)) != 0 || len(s.View(time.Now()).Keys) != 0 {
			t.Fatalf("idle key still tracked after %v: %v", time.Since(last), namedKeys(s))
		}
	})
}

// TestDemandRateIsTheReading checks that a report's demand_rate, when set,
// is the demand reading, and (admitted + denied) / window otherwise.
func TestDemandRateIsTheReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := newService(serviceOptions{
			config: StaticConfig{C: parseConfig(t, loopConfig)}, advertise: "self:7500",
			maxKeys: 4, logger: slog.New(slog.DiscardHandler),
		}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.promote(1, time.Now().Add(time.Hour), nil)
		key := &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}
		// Both regions count 8 tokens in 100ms (80/s); a reads its demand
		// as 30/s and says so.
		reports := map[string]*sluicev1.KeyDemand{
			"a": {Key: key, Admitted: 5, Denied: 3, WindowMs: 100, DemandRate: proto.Float64(30)},
			"b": {Key: key, Admitted: 5, Denied: 3, WindowMs: 100},
		}
		for seq := uint64(1); seq <= 3; seq++ {
			for _, region := range []string{"a", "b"} {
				if _, err := s.Sync(t.Context(), &sluicev1.RegionReport{Region: region, Seq: seq, Keys: []*sluicev1.KeyDemand{reports[region]}}); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(100 * time.Millisecond)
			s.step(time.Now())
		}
		v := s.View(time.Now())
		if len(v.Keys) != 1 {
			t.Fatalf("want one key, got %+v", v.Keys)
		}
		if a, b := v.Keys[0].Regions[0].Demand, v.Keys[0].Regions[1].Demand; math.Abs(a-30) > 1e-9 || math.Abs(b-80) > 1e-9 {
			t.Fatalf("demand a %v, b %v; want 30 (the reading) and 80 (the count)", a, b)
		}
	})
}
