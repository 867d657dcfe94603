package regionsync

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
)

// wireConfig has regions ap, eu, us and a write class whose default limit
// is below one token per second with a burst of one.
func wireConfig(t *testing.T) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(`
regions: {ap: {weight: 1}, eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 0.5/s, burst: 1}}}
default_tier: free
`))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

func wireKey(tenant string) *sluicev1.QuotaKey {
	return &sluicev1.QuotaKey{Tenant: tenant, Class: "write"}
}

// TestDecodeReportAtItsBounds: every field of a region report is accepted
// at the edges of its range (0, 1 ms, MaxWireMillis, MaxConfigs
// revisions, maxKeys keys, a limit below one token per second and a burst
// of one) and refused one step past them, with ErrInvalid; an accepted
// key converts field for field.
func TestDecodeReportAtItsBounds(t *testing.T) {
	cfg := wireConfig(t)
	valid := func() *sluicev1.RegionReport {
		return &sluicev1.RegionReport{Region: "eu", Seq: 7, ConfigRevisions: []int64{0, 3}, Keys: []*sluicev1.KeyDemand{
			{Key: wireKey("acme"), Admitted: 0, Denied: 0, WindowMs: 1, HeldValidMs: 0},
			{Key: wireKey("beta"), Admitted: 12, Denied: 3, WindowMs: MaxWireMillis, HeldRate: 0.25, HeldBurst: 1, HeldValidMs: MaxWireMillis, Holding: 0.5},
			{Key: wireKey("gamma"), WindowMs: 2000, DemandRate: proto.Float64(0)},
		}}
	}
	for _, c := range []struct {
		name  string
		edit  func(r *sluicev1.RegionReport)
		field string // "" accepted; else the refusal names it
	}{
		{"valid", func(*sluicev1.RegionReport) {}, ""},
		{"no region", func(r *sluicev1.RegionReport) { r.Region = "" }, "region is empty"},
		{"an unconfigured region", func(r *sluicev1.RegionReport) { r.Region = "mars" }, "mars"},
		{"MaxConfigs revisions", func(r *sluicev1.RegionReport) { r.ConfigRevisions = make([]int64, MaxConfigs) }, ""},
		{"one revision too many", func(r *sluicev1.RegionReport) { r.ConfigRevisions = make([]int64, MaxConfigs+1) }, "config_revisions"},
		{"a negative revision", func(r *sluicev1.RegionReport) { r.ConfigRevisions[1] = -1 }, "config_revisions[1]"},
		{"one key too many", func(r *sluicev1.RegionReport) {
			r.Keys = append(r.Keys, &sluicev1.KeyDemand{Key: wireKey("d"), WindowMs: 1})
		}, "keys has 4"},
		{"a key missing", func(r *sluicev1.RegionReport) { r.Keys[2].Key = nil }, "keys[2].key is missing"},
		{"an invalid key", func(r *sluicev1.RegionReport) { r.Keys[2].Key.Tenant = "" }, "keys[2].key: "},
		{"a key of an unconfigured class", func(r *sluicev1.RegionReport) { r.Keys[2].Key.Class = "read" }, "not configured"},
		{"negative admitted", func(r *sluicev1.RegionReport) { r.Keys[1].Admitted = -1 }, "keys[1].admitted"},
		{"negative denied", func(r *sluicev1.RegionReport) { r.Keys[1].Denied = -1 }, "keys[1].denied"},
		{"window 0", func(r *sluicev1.RegionReport) { r.Keys[0].WindowMs = 0 }, "keys[0].window_ms"},
		{"window past MaxWireMillis", func(r *sluicev1.RegionReport) { r.Keys[1].WindowMs = MaxWireMillis + 1 }, "keys[1].window_ms"},
		{"negative held rate", func(r *sluicev1.RegionReport) { r.Keys[1].HeldRate = -0.5 }, "keys[1].held_rate"},
		{"infinite held rate", func(r *sluicev1.RegionReport) { r.Keys[1].HeldRate = math.Inf(1) }, "keys[1].held_rate"},
		{"NaN held burst", func(r *sluicev1.RegionReport) { r.Keys[1].HeldBurst = math.NaN() }, "keys[1].held_burst"},
		{"released tokens", func(r *sluicev1.RegionReport) { r.Keys[1].Released = 0.75 }, ""},
		{"negative released", func(r *sluicev1.RegionReport) { r.Keys[1].Released = -1 }, "keys[1].released"},
		{"NaN released", func(r *sluicev1.RegionReport) { r.Keys[1].Released = math.NaN() }, "keys[1].released"},
		{"negative held validity", func(r *sluicev1.RegionReport) { r.Keys[0].HeldValidMs = -1 }, "keys[0].held_valid_ms"},
		{"held validity past MaxWireMillis", func(r *sluicev1.RegionReport) { r.Keys[1].HeldValidMs = MaxWireMillis + 1 }, "keys[1].held_valid_ms"},
		{"negative holding", func(r *sluicev1.RegionReport) { r.Keys[1].Holding = -1 }, "keys[1].holding"},
		{"infinite holding", func(r *sluicev1.RegionReport) { r.Keys[1].Holding = math.Inf(-1) }, "keys[1].holding"},
		{"negative demand rate", func(r *sluicev1.RegionReport) { r.Keys[2].DemandRate = proto.Float64(-1) }, "keys[2].demand_rate"},
		{"NaN demand rate", func(r *sluicev1.RegionReport) { r.Keys[2].DemandRate = proto.Float64(math.NaN()) }, "keys[2].demand_rate"},
	} {
		req := valid()
		c.edit(req)
		rep, limits, err := DecodeReport(cfg, req, 3)
		if c.field != "" {
			if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), c.field) || len(rep.Keys) != 0 || limits != nil {
				t.Errorf("%s: %v (%d keys), want ErrInvalid naming %q and nothing decoded", c.name, err, len(rep.Keys), c.field)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
			continue
		}
		if rep.Region != "eu" || rep.Seq != 7 || len(rep.Keys) != len(req.Keys) || len(limits) != len(req.Keys) {
			t.Errorf("%s: decoded %+v, limits %v", c.name, rep, limits)
			continue
		}
		for _, l := range limits {
			if l.Rate != 0.5 || l.Burst != 1 || l.Unit != 1 {
				t.Errorf("%s: limit %+v, want 0.5/s, burst 1, unit 1", c.name, l)
			}
		}
	}
	rep, _, err := DecodeReport(cfg, valid(), 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []hierarchy.KeyDemand{
		{Key: quota.Key{Tenant: "acme", Class: "write"}, Window: time.Millisecond},
		{Key: quota.Key{Tenant: "beta", Class: "write"}, Admitted: 12, Denied: 3, Window: time.Duration(MaxWireMillis) * time.Millisecond,
			HeldRate: 0.25, HeldBurst: 1, HeldValid: time.Duration(MaxWireMillis) * time.Millisecond, Holding: 0.5},
		{Key: quota.Key{Tenant: "gamma", Class: "write"}, Window: 2 * time.Second},
	}
	for i := range want {
		if rep.Keys[i] != want[i] {
			t.Errorf("keys[%d] decoded as %+v, want %+v", i, rep.Keys[i], want[i])
		}
	}
	req := valid()
	req.Keys[2].DemandRate = proto.Float64(3)
	req.Keys[2].Admitted, req.Keys[2].Denied = 100, 50
	if rep, _, err := DecodeReport(cfg, req, 3); err != nil || rep.Keys[2].Admitted != 6 || rep.Keys[2].Denied != 0 {
		t.Errorf("a demand rate of 3/s over 2 s decoded as %+v (%v), want 6 admitted and none denied", rep.Keys[2], err)
	}
}

// TestDecodeReportRefusesAConfigWithoutALimit: a config that skipped
// validation may give a key a rate or burst that is not positive and
// finite; a report naming it is refused with ErrInvalid, naming the key,
// before anything is decoded.
func TestDecodeReportRefusesAConfigWithoutALimit(t *testing.T) {
	for _, c := range []struct {
		name        string
		rate, burst float64
	}{
		{"rate 0", 0, 1},
		{"a negative rate", -0.5, 1},
		{"an infinite rate", math.Inf(1), 1},
		{"a NaN rate", math.NaN(), 1},
		{"burst 0", 0.5, 0},
		{"a negative burst", 0.5, -1},
	} {
		cfg := wireConfig(t)
		cfg.Tiers["free"]["write"] = config.LimitSpec{Rate: config.Rate(c.rate), Burst: c.burst}
		req := &sluicev1.RegionReport{Region: "eu", Keys: []*sluicev1.KeyDemand{{Key: wireKey("acme"), WindowMs: 1}}}
		rep, limits, err := DecodeReport(cfg, req, 1)
		if !errors.Is(err, quota.ErrInvalid) || !strings.Contains(err.Error(), "keys[0].key acme/write: the config gives it") || len(rep.Keys) != 0 || limits != nil {
			t.Errorf("%s: %v (%d keys), want ErrInvalid naming keys[0] and nothing decoded", c.name, err, len(rep.Keys))
		}
	}
}

// TestDecodeKeysOfAPage: a page's keys are named by their place in the
// whole report, and a key named twice is left to the allocator
// (hierarchy.Allocator.CheckReportKeys).
func TestDecodeKeysOfAPage(t *testing.T) {
	cfg := wireConfig(t)
	bad := []*sluicev1.KeyDemand{{Key: wireKey("gamma"), WindowMs: 1}, {Key: wireKey("delta"), WindowMs: 1}, {Key: wireKey("eps"), WindowMs: 0}}
	if kds, limits, err := DecodeKeys(cfg, bad, 2); err == nil || !strings.Contains(err.Error(), "keys[4].window_ms") || kds != nil || limits != nil {
		t.Fatalf("a bad page: %v, want keys[4].window_ms named and nothing decoded", err)
	}
	twice := []*sluicev1.KeyDemand{{Key: wireKey("gamma"), WindowMs: 1}, {Key: wireKey("gamma"), WindowMs: 2}}
	kds, limits, err := DecodeKeys(cfg, twice, 2)
	if err != nil || len(kds) != 2 || len(limits) != 2 || kds[1].Key != kds[0].Key || kds[1].Window != 2*time.Millisecond {
		t.Fatalf("a key twice: %v, %+v", err, kds)
	}
}

// TestEncodeGrants: the answer carries the report's region and seq, each
// grant with its validity in whole milliseconds, whether the allocator is
// learning, its epoch and report_again_ms.
func TestEncodeGrants(t *testing.T) {
	rep := hierarchy.Report{Region: "eu", Seq: 42}
	g := EncodeGrants(rep, []hierarchy.Grant{
		{Key: quota.Key{Tenant: "acme", Class: "write"}, Rate: 1.5, Burst: 3, Valid: 2500*time.Millisecond + 999*time.Microsecond},
	}, true, 9, 40*time.Millisecond+500*time.Microsecond)
	if g.GetRegion() != "eu" || g.GetSeq() != 42 || !g.GetLearning() || g.GetEpoch() != 9 || g.GetReportAgainMs() != 40 || len(g.GetGrants()) != 1 {
		t.Fatalf("answer %v", g)
	}
	kg := g.GetGrants()[0]
	if kg.GetKey().GetTenant() != "acme" || kg.GetKey().GetClass() != "write" || kg.GetRate() != 1.5 || kg.GetBurst() != 3 || kg.GetValidMs() != 2500 {
		t.Fatalf("grant %v", kg)
	}
}

// TestDefaultMaxKeysIsTheDocumentedPage: a report message holds at most
// 100,000 keys unless configured otherwise.
func TestDefaultMaxKeysIsTheDocumentedPage(t *testing.T) {
	if DefaultMaxKeys != 100_000 {
		t.Fatalf("DefaultMaxKeys = %d, want 100000", DefaultMaxKeys)
	}
}
