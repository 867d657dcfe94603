package oracle

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// TestSetupValidation: New refuses every setup it cannot judge by and
// accepts the edges of what it can.
func TestSetupValidation(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, c := range []struct {
		name string
		mod  func(s *Setup)
		ok   bool
	}{
		{"valid", func(s *Setup) {}, true},
		{"no regions", func(s *Setup) { s.Regions = nil }, false},
		{"no epoch", func(s *Setup) { s.Epoch = 0 }, false},
		{"negative epoch", func(s *Setup) { s.Epoch = -1 }, false},
		{"no duration", func(s *Setup) { s.Duration = 0 }, false},
		{"negative duration", func(s *Setup) { s.Duration = -1 }, false},
		{"a nanosecond epoch and duration", func(s *Setup) { s.Epoch, s.Duration = 1, 1 }, true},
		{"demand alpha 1", func(s *Setup) { s.DemandAlpha = 1 }, true},
		{"demand alpha small", func(s *Setup) { s.DemandAlpha = 1e-9 }, true},
		{"demand alpha above 1", func(s *Setup) { s.DemandAlpha = 1.0000001 }, false},
		{"demand alpha negative", func(s *Setup) { s.DemandAlpha = -0.5 }, false},
		{"demand alpha NaN", func(s *Setup) { s.DemandAlpha = nan }, false},
		{"weight zero", func(s *Setup) { s.Regions[1].Weight = 0 }, false},
		{"weight negative", func(s *Setup) { s.Regions[1].Weight = -1 }, false},
		{"weight infinite", func(s *Setup) { s.Regions[1].Weight = inf }, false},
		{"weight NaN", func(s *Setup) { s.Regions[1].Weight = nan }, false},
		{"min share 1", func(s *Setup) { s.Regions[1].MinShare = 1 }, true},
		{"min share above 1", func(s *Setup) { s.Regions[1].MinShare = 1.01 }, false},
		{"min share negative", func(s *Setup) { s.Regions[1].MinShare = -0.01 }, false},
		{"min share NaN", func(s *Setup) { s.Regions[1].MinShare = nan }, false},
		{"max share 1", func(s *Setup) { s.Regions[1].MaxShare = 1 }, true},
		{"max share above 1", func(s *Setup) { s.Regions[1].MaxShare = 1.01 }, false},
		{"max share negative", func(s *Setup) { s.Regions[1].MaxShare = -0.01 }, false},
		{"max share NaN", func(s *Setup) { s.Regions[1].MaxShare = nan }, false},
		{"min share equal to max share", func(s *Setup) { s.Regions[1].MinShare, s.Regions[1].MaxShare = 0.3, 0.3 }, true},
		{"min share above max share", func(s *Setup) { s.Regions[1].MinShare, s.Regions[1].MaxShare = 0.4, 0.3 }, false},
		{"min share without a max share", func(s *Setup) { s.Regions[1].MinShare = 0.4 }, true},
		{"rate zero", func(s *Setup) { s.Keys[1].Rate = 0 }, false},
		{"rate negative", func(s *Setup) { s.Keys[1].Rate = -1 }, false},
		{"rate infinite", func(s *Setup) { s.Keys[1].Rate = inf }, false},
		{"rate NaN", func(s *Setup) { s.Keys[1].Rate = nan }, false},
		{"rate tiny", func(s *Setup) { s.Keys[1].Rate = 1e-300 }, true},
		{"burst zero", func(s *Setup) { s.Keys[1].Burst = 0 }, false},
		{"burst NaN", func(s *Setup) { s.Keys[1].Burst = nan }, false},
		{"static rates short", func(s *Setup) { s.Keys[1].StaticRate = s.Keys[1].StaticRate[:1] }, false},
		{"static bursts long", func(s *Setup) { s.Keys[1].StaticBurst = append(s.Keys[1].StaticBurst, 1) }, false},
		{"floor rates", func(s *Setup) { s.Keys[1].FloorRate = []float64{1, 1} }, true},
		{"floor rates short", func(s *Setup) { s.Keys[1].FloorRate = []float64{1} }, false},
		{"floor bursts", func(s *Setup) { s.Keys[1].FloorBurst = []float64{1, 1} }, true},
		{"floor bursts long", func(s *Setup) { s.Keys[1].FloorBurst = []float64{1, 1, 1} }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := Setup{
				Regions: []Region{{Name: "a", Weight: 1}, {Name: "b", Weight: 2}},
				Keys: []Key{
					{Key: quota.Key{Tenant: "u", Class: "c"}, Rate: 100, Burst: 200, StaticRate: []float64{50, 50}, StaticBurst: []float64{100, 100}},
					{Key: quota.Key{Tenant: "v", Class: "c"}, Rate: 10, Burst: 20, StaticRate: []float64{5, 5}, StaticBurst: []float64{10, 10}},
				},
				Epoch: sec, Duration: time.Minute,
			}
			c.mod(&s)
			o, err := New(s)
			if (err == nil) != c.ok {
				t.Fatalf("New: %v, want ok %v", err, c.ok)
			}
			if err == nil {
				r := o.Finish(s.Duration)
				if r.Keys != 2 || !slices.Equal(r.Regions, []string{"a", "b"}) {
					t.Fatalf("result names %d keys, regions %v", r.Keys, r.Regions)
				}
			}
		})
	}
}

// TestSetupDefaults: the series step is the run's 720th rounded to whole
// seconds and at least one; the recovered level 0.97.
func TestSetupDefaults(t *testing.T) {
	for _, c := range []struct {
		duration, step, want time.Duration
	}{
		{time.Minute, 0, sec},
		{100 * time.Minute, 0, 8 * sec}, // 8.33 s
		{102 * time.Minute, 0, 9 * sec}, // 8.5 s rounds up
		{time.Hour, 0, 5 * sec},
		{time.Hour, 3 * sec, 3 * sec},
	} {
		o := twoRegions(t, func(s *Setup) { s.Duration, s.Step = c.duration, c.step })
		if r := o.Finish(c.duration); r.Series.Step != c.want || r.Recovered.Level != 0.97 {
			t.Fatalf("duration %v step %v: step %v level %v, want %v", c.duration, c.step, r.Series.Step, r.Recovered.Level, c.want)
		}
	}
	o := twoRegions(t, func(s *Setup) { s.RecoveredLevel = 0.5 })
	if r := o.Finish(sec); r.Recovered.Level != 0.5 {
		t.Fatalf("level %v", r.Recovered.Level)
	}
}
