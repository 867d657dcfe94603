package hierarchy

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// smallKeyRun drives one key of rate 1/m and burst 1 over two regions of
// equal weight for the given epochs: us-east's demand arrives one request
// at a time (readings[e] requests in epoch e), eu-west, which holds the
// static unit, has none. Each region reports every epoch, echoing the
// grant it holds, as a region leader does. From the tenth epoch on it
// fails unless every Allocate leaves the key contended with us-east's
// target burst at the unit, and it returns, per such epoch, us-east's
// usable burst cap (its grant while valid, else its static cap 0) after
// its report.
func smallKeyRun(t *testing.T, readings []float64) []float64 {
	t.Helper()
	regions := []Region{{Name: "eu-west", Weight: 1}, {Name: "us-east", Weight: 1}}
	// demand_alpha 1, the config's default: each reading is the estimate.
	a, err := NewAllocator(Options{Regions: regions, Epoch: time.Second, Validity: 5 * time.Second, DemandAlpha: 1}, testStart)
	if err != nil {
		t.Fatal(err)
	}
	key := quota.Key{Tenant: "acme", Class: "read"}
	if err := a.SetLimit(key, KeyLimit{Rate: 1.0 / 60, Burst: 1}); err != nil {
		t.Fatal(err)
	}
	type held struct {
		rate, burst float64
		until       int64 // ms
	}
	var hold [2]held
	var seq [2]uint64
	var caps []float64
	for e := range readings {
		now := 6000 + 1000*e
		a.Allocate(ms(now))
		if e >= 10 {
			kv := a.View(ms(now)).Keys[0]
			if !kv.Contended || kv.Regions[1].TargetBurst != 1 {
				t.Fatalf("epoch %d: contended %v, us-east's target burst %v, want the key contended and the unit in us-east (readings %v)",
					e, kv.Contended, kv.Regions[1].TargetBurst, readings[e-5:e])
			}
		}
		for i, rg := range regions {
			at := now + 100 + 300*i
			seq[i]++
			kd := KeyDemand{Key: key, Window: time.Second}
			if i == 1 {
				kd.Denied = readings[e]
			}
			if h := hold[i]; h.until > int64(at) {
				kd.HeldRate, kd.HeldBurst, kd.HeldValid = h.rate, h.burst, time.Duration(h.until-int64(at))*time.Millisecond
			}
			ans, err := a.Report(ms(at), Report{Region: rg.Name, Seq: seq[i], Keys: []KeyDemand{kd}})
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range ans.Grants {
				hold[i] = held{g.Rate, g.Burst, int64(at) + g.Valid.Milliseconds()}
			}

			if i == 1 && e >= 10 {
				c := 0.0 // us-east's static cap: the unit is eu-west's
				if hold[1].until > int64(at) {
					c = hold[1].burst
				}
				caps = append(caps, c)
			}
		}
	}
	v := a.View(ms(6000 + 1000*len(readings)))
	if sb := v.Keys[0].Regions; sb[0].StaticBurst != 1 || sb[1].StaticBurst != 0 {
		t.Fatalf("static caps %v/%v, want the unit in eu-west", sb[0].StaticBurst, sb[1].StaticBurst)
	}
	return caps
}

// TestSparseDemandKeepsTheOnlyUnit: a key of 1/m and burst 1 whose only
// demand, 1 request/s in us-east, reads 0 or 1 request in an epoch. The
// unit must move to us-east and stay there: an empty reading is no sign
// that the demand stopped, and each move empties the unit (the region it
// goes to refills it at 1/m). Before the hold, the epoch after an empty
// reading found the key uncontended with the unit's target back in
// eu-west; in the simulator us-east held the unit in about half the
// seconds, never long enough to refill it, and the fleet admitted nothing
// in ten minutes.
func TestSparseDemandKeepsTheOnlyUnit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		readings func(e int) float64
	}{
		{"every other epoch", func(e int) float64 { return float64(e % 2) }},
		{"runs of up to four empty epochs", func(e int) float64 {
			if e%5 == 0 || e%7 == 0 {
				return 1
			}
			return 0
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			readings := make([]float64, 130)
			for e := range readings {
				readings[e] = tc.readings(e)
			}
			readings[0] = 1 // the demand is there from the start
			caps := smallKeyRun(t, readings)
			for e, c := range caps {
				if math.Abs(c-1) > 1e-9 {
					t.Fatalf("epoch %d: us-east's burst cap %v, want the unit (1) in every epoch from the tenth: %v", e+10, c, caps)
				}
			}
		})
	}
}
