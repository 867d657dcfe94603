package world

import (
	"testing"
	"time"
)

// TestStrictDemandWithinItsShareIsGrantedWhole: a strict key of 50/s whose
// region a (weight 3) asks for a steady 20/s, within its fair share, while
// region b asks for 80/s, is granted 20/s in a and 30/s in b at every
// moment of the steady state, and a admits all it is asked for. The region
// leader's watch between epochs judged a strict key's demand by its leases
// alone (none), so a key granted its demand always looked fallen: the
// report it started went out with the strict decisions of the few
// milliseconds since the epoch report taken as a reading over a whole
// epoch (2 decisions in 125 ms: 16/s), and a's grant went 20, 16, 20, 16…
// every other epoch, admitting about 17/s of its 20.
func TestStrictDemandWithinItsShareIsGrantedWhole(t *testing.T) {
	h := buildFrom(t, `
name: strict-fair
duration: 1m
warmup: 20s
sluice:
  regions: {a: {weight: 3}, b: {weight: 1}}
  classes: {pay: {mode: strict, on_failure: closed}}
  tiers: {std: {pay: {rate: 50/s, burst: 10}}}
  default_tier: std
topology:
  regions: [{name: a, instances: 2}, {name: b, instances: 2}]
  global: {primary: a}
workload:
  - {tenant: z, class: pay, process: constant, rate: {a: 20/s, b: 80/s}}
`)
	h.start()
	var a *Region
	for _, r := range h.w.regions {
		if r.name == "a" {
			a = r
		}
	}
	k := h.w.keys[0]
	const from, to = 20 * time.Second, 60 * time.Second
	h.until(from)
	start, ok := a.model.PeekBucket(k.rkeys)
	if !ok {
		t.Fatal("a holds no bucket of the key after the warmup")
	}
	low, lowAt := 0.0, time.Duration(0)
	for at := from; at <= to; at += 10 * time.Millisecond {
		h.until(at)
		p, _ := a.model.PeekBucket(k.rkeys)
		rate := a.common(k).StaticRate
		if p.GrantExpiryUS > a.redisNowUS() {
			rate = p.GrantRate
		}
		if rate < 20-1e-6 && (lowAt == 0 || rate < low) {
			low, lowAt = rate, at
		}
	}
	end, _ := a.model.PeekBucket(k.rkeys)
	admitted, denied := end.Admitted-start.Admitted, end.Denied-start.Denied
	if lowAt != 0 {
		t.Errorf("a refilled at %.3f/s at %v, below its steady demand of 20/s (within its fair share)", low, lowAt)
	}
	if denied > admitted/100 {
		t.Errorf("a admitted %d and denied %d of a steady 20/s within its fair share between %v and %v", admitted, denied, from, to)
	}
}
