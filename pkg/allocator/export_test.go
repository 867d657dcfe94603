package allocator

import (
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/quota"
)

// BadReport is one invalid RegionReport and a part of the message naming
// what is wrong with it.
type BadReport struct {
	Name   string
	Report *sluicev1.RegionReport
	Want   string
}

// BadReports are invalid against a config with regions a and b, class
// write and tenants of the default tier. Several start with a valid key
// that must not be touched either.
func BadReports() []BadReport {
	key := func(tenant, class string) *sluicev1.QuotaKey {
		return &sluicev1.QuotaKey{Tenant: tenant, Class: class}
	}
	ok := func(tenant string) *sluicev1.KeyDemand {
		return &sluicev1.KeyDemand{Key: key(tenant, "write"), Admitted: 5, WindowMs: 100}
	}
	with := func(f func(*sluicev1.KeyDemand)) *sluicev1.KeyDemand {
		kd := ok("acme")
		f(kd)
		return kd
	}
	rep := func(region string, keys ...*sluicev1.KeyDemand) *sluicev1.RegionReport {
		return &sluicev1.RegionReport{Region: region, Seq: 1 << 40, Keys: keys}
	}
	return []BadReport{
		{"unknown region", rep("nowhere", ok("acme")), `region "nowhere" is not configured`},
		{"empty region", rep("", ok("acme")), "region is empty"},
		{"region with a bad byte", rep("a b", ok("acme")), `region "a b" has byte ' '`},
		{"missing key", rep("a", ok("fresh-1"), &sluicev1.KeyDemand{WindowMs: 100}), "keys[1].key is missing"},
		{"bad tenant", rep("a", ok("fresh-2"), &sluicev1.KeyDemand{Key: key("ac me", "write"), WindowMs: 100}), "keys[1].key: invalid argument: tenant"},
		{"empty class", rep("a", &sluicev1.KeyDemand{Key: key("acme", ""), WindowMs: 100}), "keys[0].key: invalid argument: class is empty"},
		{"unknown class", rep("a", ok("fresh-3"), &sluicev1.KeyDemand{Key: key("acme", "nosuch"), WindowMs: 100}), `keys[1].key acme/nosuch: invalid argument: class "nosuch" is not configured`},
		{"negative admitted", rep("a", with(func(k *sluicev1.KeyDemand) { k.Admitted = -1 })), "keys[0].admitted -1 must be >= 0"},
		{"negative denied", rep("a", ok("fresh-4"), with(func(k *sluicev1.KeyDemand) { k.Denied = -3 })), "keys[1].denied -3 must be >= 0"},
		{"negative demand rate", rep("a", with(func(k *sluicev1.KeyDemand) { k.DemandRate = proto.Float64(-2) })), "keys[0].demand_rate -2 must be a finite number >= 0"},
		{"NaN demand rate", rep("a", ok("fresh-6"), with(func(k *sluicev1.KeyDemand) { k.DemandRate = proto.Float64(math.NaN()) })), "keys[1].demand_rate NaN must be a finite number >= 0"},
		{"zero window", rep("a", with(func(k *sluicev1.KeyDemand) { k.WindowMs = 0 })), "keys[0].window_ms 0 must be in 1.."},
		{"negative window", rep("a", with(func(k *sluicev1.KeyDemand) { k.WindowMs = -100 })), "keys[0].window_ms -100 must be in 1.."},
		{"window overflowing a duration", rep("a", with(func(k *sluicev1.KeyDemand) { k.WindowMs = math.MaxInt64 })), "keys[0].window_ms 9223372036854775807 must be in 1.."},
		{"NaN held rate", rep("a", with(func(k *sluicev1.KeyDemand) { k.HeldRate = math.NaN() })), "keys[0].held_rate NaN must be a finite number >= 0"},
		{"negative held rate", rep("a", with(func(k *sluicev1.KeyDemand) { k.HeldRate = -1 })), "keys[0].held_rate -1 must be a finite number >= 0"},
		{"infinite held burst", rep("a", with(func(k *sluicev1.KeyDemand) { k.HeldBurst = math.Inf(1) })), "keys[0].held_burst +Inf must be a finite number >= 0"},
		{"negative held validity", rep("a", with(func(k *sluicev1.KeyDemand) { k.HeldValidMs = -5 })), "keys[0].held_valid_ms -5 must be in 0.."},
		{"negative holding", rep("a", with(func(k *sluicev1.KeyDemand) { k.Holding = -1 })), "keys[0].holding -1 must be a finite number >= 0"},
		{"NaN holding", rep("a", with(func(k *sluicev1.KeyDemand) { k.Holding = math.NaN() })), "keys[0].holding NaN must be a finite number >= 0"},
		{"duplicate key", rep("b", ok("acme"), ok("fresh-5"), ok("acme")), "keys[2].key acme/write duplicates keys[0]"},
	}
}

// namedKeys is each key the service's allocator holds and when a report
// or an answer last named it (hierarchy.Allocator.LastNamed). s.mu is held,
// or the allocator is not replaced meanwhile.
func namedKeys(s *Service) map[quota.Key]time.Time {
	a := s.alloc
	out := make(map[quota.Key]time.Time)
	for _, k := range a.Keys() {
		if at, ok := a.LastNamed(k); ok {
			out[k] = at
		}
	}
	return out
}
