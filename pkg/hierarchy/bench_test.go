package hierarchy

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// benchWorld is a steady-state world: every key contended, every region
// reporting every key each epoch and echoing the grants it received.
type benchWorld struct {
	alloc   *Allocator
	regions []Region
	reports []Report
	slot    map[quota.Key]int
	now     time.Time
	sent    [][]time.Time // per region per key: send time of the report its grant answered
}

func newBenchWorld(tb testing.TB, nKeys int) *benchWorld {
	keys := make([]quota.Key, nKeys)
	for k := range keys {
		keys[k] = quota.Key{Tenant: fmt.Sprintf("tenant-%06d", k), Class: "write"}
	}
	return newBenchWorldOf(tb, keys)
}

// newBenchWorldOf is newBenchWorld over the given keys.
func newBenchWorldOf(tb testing.TB, keys []quota.Key) *benchWorld {
	nKeys := len(keys)
	regions := []Region{
		{Name: "us-east", Weight: 2}, {Name: "us-west", Weight: 1}, {Name: "eu-west", Weight: 1},
		{Name: "ap-south", Weight: 1}, {Name: "sa-east", Weight: 1},
	}
	start := time.Unix(1_700_000_000, 0)
	a, err := NewAllocator(Options{Regions: regions, Epoch: time.Second, Validity: 5 * time.Second}, start)
	if err != nil {
		tb.Fatal(err)
	}
	w := &benchWorld{alloc: a, regions: regions, slot: make(map[quota.Key]int, nKeys), now: start}
	for k := range keys {
		w.slot[keys[k]] = k
		if err := a.SetLimit(keys[k], KeyLimit{Rate: 1000, Burst: 2000}); err != nil {
			tb.Fatal(err)
		}
	}
	w.reports = make([]Report, len(regions))
	for r := range regions {
		rep := Report{Region: regions[r].Name, Keys: make([]KeyDemand, nKeys)}
		for k := range keys {
			// Every key has two hot regions (well above their static share)
			// and three cooler ones, rotating with the key.
			demand := 100.0 + float64((k+r)%5)*150
			if (k+r)%5 >= 3 {
				demand = 900
			}
			rep.Keys[k] = KeyDemand{Key: keys[k], Admitted: demand, Window: time.Second}
		}
		w.reports[r] = rep
	}
	return w
}

// epoch runs one allocation epoch and one report per region, echoing the
// previous answers, and returns how many grants were issued.
func (w *benchWorld) epoch(tb testing.TB, timed func(bool)) int {
	w.now = w.now.Add(time.Second)
	timed(true)
	w.alloc.Allocate(w.now)
	timed(false)
	n := 0
	for r := range w.reports {
		rep := &w.reports[r]
		rep.Seq++
		sendAt := w.now.Add(time.Duration(r+1) * 10 * time.Millisecond)
		timed(true)
		grants, err := grantsOf(w.alloc.Report(sendAt, *rep))
		timed(false)
		if err != nil {
			tb.Fatal(err)
		}
		n += len(grants)
		for j, g := range grants {
			// Grants come in report order when every reported key gets one.
			kd := &rep.Keys[min(j, len(rep.Keys)-1)]
			if kd.Key != g.Key {
				kd = &rep.Keys[w.slot[g.Key]]
			}
			kd.HeldRate, kd.HeldBurst = g.Rate, g.Burst
			kd.HeldValid = g.Valid - time.Second
			kd.Holding = g.Burst / 2
		}
	}
	return n
}

func BenchmarkAllocateEpoch(b *testing.B) {
	w := newBenchWorld(b, 100_000)
	noop := func(bool) {}
	for i := 0; i < 8; i++ { // past learning mode, into steady state
		w.epoch(b, noop)
	}
	timed := func(on bool) {
		if on {
			b.StartTimer()
		} else {
			b.StopTimer()
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.StopTimer()
	grants := 0
	for i := 0; i < b.N; i++ {
		grants += w.epoch(b, timed)
	}
	b.ReportMetric(float64(grants)/float64(b.N), "grants/epoch")
}
