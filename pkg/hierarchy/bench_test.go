package hierarchy

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/cputime"
	"github.com/sluicehq/sluice/internal/envcount"
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
	// noise, when set, makes every report read each key's demand within
	// ±10% of its level, differently every time (a deterministic
	// sequence), instead of exactly.
	noise bool
	level [][]float64 // per region per key: the demand level
	rnd   uint64
	// setLimits, when set, sets the limit of every key a report names
	// before the report, as the daemon does (pkg/allocator, Sync): limits,
	// one per key of a report.
	setLimits bool
	limits    []KeyLimit
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
	w.level = make([][]float64, len(regions))
	for r := range regions {
		w.level[r] = make([]float64, nKeys)
		rep := Report{Region: regions[r].Name, Keys: make([]KeyDemand, nKeys)}
		for k := range keys {
			// Every key has two hot regions (well above their static share)
			// and three cooler ones, rotating with the key.
			demand := 100.0 + float64((k+r)%5)*150
			if (k+r)%5 >= 3 {
				demand = 900
			}
			rep.Keys[k] = KeyDemand{Key: keys[k], Admitted: demand, Window: time.Second}
			w.level[r][k] = demand
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
		if w.noise {
			for j := range rep.Keys {
				w.rnd = w.rnd*6364136223846793005 + 1442695040888963407
				f := 0.9 + 0.2*float64(w.rnd>>11)/(1<<53)
				rep.Keys[j].Admitted = w.level[r][w.slot[rep.Keys[j].Key]] * f
			}
		}
		sendAt := w.now.Add(time.Duration(r+1) * 10 * time.Millisecond)
		timed(true)
		if w.setLimits {
			if err := w.alloc.SetReportLimits(*rep, w.limits); err != nil {
				tb.Fatal(err)
			}
		}
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

// benchEpochKeys is BenchmarkAllocateEpoch's contended keys:
// SLUICE_EPOCH_BENCH_KEYS, default 100,000.
func benchEpochKeys(b *testing.B) int {
	return envcount.Get(b, "SLUICE_EPOCH_BENCH_KEYS", 100_000, 1)
}

// BenchmarkAllocateEpoch is one allocation epoch (Allocate, then one
// Report per region) over SLUICE_EPOCH_BENCH_KEYS contended keys × 5
// regions, every region reading the same demand every epoch. Besides the
// wall time it reports the CPU time of the thread that ran the epochs
// (thread-cpu-ms/epoch, Linux only; the garbage collector's own threads
// are not in it), which the machine's other load changes less.
func BenchmarkAllocateEpoch(b *testing.B) { benchAllocateEpoch(b, false) }

// BenchmarkAllocateEpochNoisy is BenchmarkAllocateEpoch with every demand
// reading differing from the last (within ±10%): each report moves its
// region's demand estimate of every key, so a key's targets are worked
// out anew for every region's answer.
func BenchmarkAllocateEpochNoisy(b *testing.B) { benchAllocateEpoch(b, true) }

// BenchmarkAllocateEpochLimitsSet is BenchmarkAllocateEpoch with every
// reported key's limit set (to the one it has) before each report, as the
// global daemon does (SetReportLimits).
func BenchmarkAllocateEpochLimitsSet(b *testing.B) { benchAllocateEpochOf(b, false, true) }

func benchAllocateEpoch(b *testing.B, noise bool) { benchAllocateEpochOf(b, noise, false) }

func benchAllocateEpochOf(b *testing.B, noise, setLimits bool) {
	w := newBenchWorld(b, benchEpochKeys(b))
	w.noise, w.setLimits = noise, setLimits
	w.limits = make([]KeyLimit, len(w.reports[0].Keys))
	for j := range w.limits {
		w.limits[j] = KeyLimit{Rate: 1000, Burst: 2000}
	}
	noop := func(bool) {}
	for i := 0; i < 8; i++ { // past learning mode, into steady state
		w.epoch(b, noop)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cpu time.Duration
	var from time.Duration
	timed := func(on bool) {
		if on {
			from = threadCPU(b)
			b.StartTimer()
		} else {
			b.StopTimer()
			cpu += threadCPU(b) - from
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.StopTimer()
	grants := timedEpochs(b, w, timed)
	b.ReportMetric(float64(grants)/float64(b.N), "grants/epoch")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "thread-cpu-ms/epoch")
}

// timedEpochs runs the b.N timed epochs and returns the grants issued (a
// function of its own so that an instruction count can be limited to it:
// valgrind --tool=callgrind --toggle-collect='*timedEpochs*').
//
//go:noinline
func timedEpochs(b *testing.B, w *benchWorld, timed func(bool)) int {
	grants := 0
	for i := 0; i < b.N; i++ {
		grants += w.epoch(b, timed)
	}
	return grants
}

// BenchmarkScrape is what the global daemon's metrics read at every
// scrape, over SLUICE_EPOCH_BENCH_KEYS contended keys × 5 regions: the
// whole View (what a scrape built before), and RegionViews with
// ContendedKeys (what it reads now); and what the leader's Status reads,
// TopView of the default 10 keys (it read the whole View before). Each
// holds the allocator's lock throughout: every report waits for it.
func BenchmarkScrape(b *testing.B) {
	w := newBenchWorld(b, benchEpochKeys(b))
	noop := func(bool) {}
	for i := 0; i < 8; i++ {
		w.epoch(b, noop)
	}
	b.Run("View", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			v := w.alloc.View(w.now)
			if len(v.Regions) != len(w.regions) {
				b.Fatal("regions missing")
			}
		}
	})
	b.Run("RegionViews", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if len(w.alloc.RegionViews(w.now)) != len(w.regions) || w.alloc.ContendedKeys() == 0 {
				b.Fatal("regions or contended keys missing")
			}
		}
	})
	b.Run("TopView", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if v, contended := w.alloc.TopView(w.now, 10); len(v.Keys) != 10 || contended == 0 {
				b.Fatal("keys or contended keys missing")
			}
		}
	})
}

// threadCPU is the calling thread's CPU time (0 where the system does not
// account it per thread).
func threadCPU(b *testing.B) time.Duration {
	d, err := cputime.Thread()
	if err != nil && !errors.Is(err, errors.ErrUnsupported) {
		b.Fatal(err)
	}
	return d
}
