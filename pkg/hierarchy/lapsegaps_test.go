package hierarchy

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLapsedRegionIsSilentWhateverTheSilenceTimeout: a region whose lapse
// is durable is counted at its floor and as silent, even while its last
// report is younger than the silence timeout (here 60 s, longer than the
// 16 s after which its static lease surely lapsed): its last demand
// estimate no longer keeps a share of the key's rate from the region that
// wants it.
func TestLapsedRegionIsSilentWhateverTheSilenceTimeout(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	a, err := NewAllocator(Options{
		Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}},
		Epoch:   time.Second, Validity: 5 * time.Second, RegionLease: 10 * time.Second,
		SilenceTimeout: 60 * time.Second,
	}, start)
	if err != nil {
		t.Fatal(err)
	}
	key := quota.Key{Tenant: "acme", Class: "write"}
	if err := a.SetLimit(key, KeyLimit{Rate: leaseRate, Burst: 100}); err != nil {
		t.Fatal(err)
	}
	s := &leaseScript{t: t, a: a, start: start, key: key, seq: map[string]uint64{}, held: map[string]scriptHeld{}, until: map[string]time.Time{}}
	s.until["a"], s.until["b"] = start.Add(10*time.Second), start.Add(10*time.Second)
	// a wants everything, then falls silent.
	s.report("a", 500, 2*leaseRate)
	lapsedAt := 0
	for ms := 1000; ms <= 40_000; ms += 1000 {
		a.Allocate(s.at(ms))
		if lapsedAt == 0 && len(s.persist(ms)) > 0 {
			lapsedAt = ms
		}
		s.report("b", ms+100, 2*leaseRate)
	}
	if lapsedAt == 0 || lapsedAt > 20_000 {
		t.Fatalf("a lapsed at %dms, want once 16 s of silence have passed", lapsedAt)
	}
	if got := s.usable("b", 40_100); got < leaseRate*(1-1e-9) {
		t.Fatalf("b may use %v at 40 s, %v after a's lapse was durable; want the whole rate %v (a is silent, its estimate of 200 must not count)", got, time.Duration(40_000-lapsedAt)*time.Millisecond, leaseRate)
	}
}

// TestFloorOfAPerRegionStaticShareIsTheShare: a key limited with
// per-region static rates and no floor rates runs, without a static
// lease, on that static rate (KeyLimit.FloorRate: a lapsed region's share
// is then not re-divided), not on FloorShare of its weight's share.
func TestFloorOfAPerRegionStaticShareIsTheShare(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	a, err := NewAllocator(Options{
		Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 1}},
		Epoch:   time.Second, Validity: 5 * time.Second,
	}, start)
	if err != nil {
		t.Fatal(err)
	}
	key := quota.Key{Tenant: "acme", Class: "write"}
	if err := a.SetLimit(key, KeyLimit{Rate: 100, Burst: 100, FloorShare: 0.5, StaticRate: []float64{70, 30}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Report(start.Add(100*time.Millisecond), Report{Region: "a", Seq: 1, Keys: []KeyDemand{{Key: key, Admitted: 1, Window: time.Second}}}); err != nil {
		t.Fatal(err)
	}
	kv := a.View(start.Add(200 * time.Millisecond)).Keys[0]
	for i, want := range []float64{70, 30} {
		if got := kv.Regions[i].FloorRate; got != want {
			t.Errorf("region %d's floor rate %v, want its static rate %v", i, got, want)
		}
	}
	// The burst has no per-region static share: its floor is FloorShare
	// of the static burst, 50.
	for i := range 2 {
		if got := kv.Regions[i].FloorBurst; got != 25 {
			t.Errorf("region %d's floor burst %v, want half its static burst 50", i, got)
		}
	}
}
