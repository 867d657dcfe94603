package runner_test

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/envcount"
	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/report"
	"github.com/sluicehq/sluice/sim/runner"
	"github.com/sluicehq/sluice/sim/scenario"
	"github.com/sluicehq/sluice/sim/scenarios"
)

// testDuration shortens the long scenarios for `go test`: each still
// covers its faults and at least one measured 60 s window. The full
// versions run with `go run ./sim`, SLUICE_SOAK=1 and the benchmarks.
var testDuration = map[string]time.Duration{
	"steady":           2 * time.Minute,
	"follow-the-sun":   3*time.Minute + 30*time.Second,
	"flash-crowd":      3*time.Minute + 20*time.Second,
	"instance-crash":   3 * time.Minute,
	"global-failover":  3 * time.Minute,
	"region-partition": 3*time.Minute + 10*time.Second,
	"region-drain":     3*time.Minute + 20*time.Second,
	// Death at 1m, 30 s to recover, 90 s measured after.
	"region-outage": 3 * time.Minute,
	// Healed at 1m30s, 30 s to recover, 60 s measured after.
	"region-long-partition": 3 * time.Minute,
	"redis-outage":          3 * time.Minute,
	"etcd-outage":           3 * time.Minute,
	"rolling-restart":       3 * time.Minute,
	"retries":               3*time.Minute + 20*time.Second,
	"chaos":                 150 * time.Second, // with its faults compressed, see below
	"demand-shift":          90 * time.Second,  // the whole scenario
	"small-keys":            10 * time.Minute,  // the whole scenario: one key, nine refills of its unit
}

func TestShippedScenariosHoldTheInvariantsAndMeetTheirTargets(t *testing.T) {
	for _, name := range scenarios.Names() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sc, err := scenarios.Load(name)
			if err != nil {
				t.Fatal(err)
			}
			d, ok := testDuration[name]
			if !ok {
				t.Fatalf("scenario %s has no test duration", name)
			}
			if sc.Chaos != nil {
				// Keep the chaos: a fault every 15 s on average from 20 s on.
				ch := *sc.Chaos
				ch.Start = scenario.Duration(20 * time.Second)
				ch.End = scenario.Duration(120 * time.Second)
				ch.MeanGap = scenario.Duration(15 * time.Second)
				sc.Chaos = &ch
			}
			out, err := runner.Run(sc, runner.Options{Duration: d})
			if err != nil {
				t.Fatal(err)
			}
			if sc.Chaos != nil && len(out.Result.Faults) < 3 {
				t.Errorf("only %d chaos faults drawn", len(out.Result.Faults))
			}
			if out.Counters.InvalidDecisions != 0 || out.Counters.AllocatorErrors != 0 || out.Counters.ApplyErrors != 0 {
				t.Errorf("simulator errors: %+v", out.Counters)
			}
			for _, c := range out.Checks {
				if !c.Pass {
					t.Errorf("%s: %s (target %s)", c.Name, c.Value, c.Target)
				}
			}
			if t.Failed() {
				t.Logf("summary:\n%s", report.Summary(out))
			}
		})
	}
}

func TestSameSeedSameBytes(t *testing.T) {
	t.Parallel()
	// Faults, contention and demand shifts exercise every source of order:
	// waiters on in-flight reports, crashes, elections, grant fencing.
	for _, c := range []struct {
		name      string
		d         time.Duration
		otherSeed bool
	}{{"instance-crash", 95 * time.Second, true}, {"follow-the-sun", 125 * time.Second, false}, {"region-drain", 100 * time.Second, false}} {
		sc, err := scenarios.Load(c.name)
		if err != nil {
			t.Fatal(err)
		}
		render := func(seed uint64) (string, []byte) {
			out, err := runner.Run(sc, runner.Options{Seed: seed, Duration: c.d})
			if err != nil {
				t.Fatal(err)
			}
			var page, csv bytes.Buffer
			if err := report.WriteHTML(&page, out); err != nil {
				t.Fatal(err)
			}
			if err := report.WriteCSV(&csv, out); err != nil {
				t.Fatal(err)
			}
			return report.Summary(out), append(page.Bytes(), csv.Bytes()...)
		}
		s1, b1 := render(42)
		s2, b2 := render(42)
		if s1 != s2 {
			t.Fatalf("%s: same seed, different summaries:\n%s\n---\n%s", c.name, s1, s2)
		}
		if !bytes.Equal(b1, b2) {
			t.Fatalf("%s: same seed, different report or CSV", c.name)
		}
		if !c.otherSeed {
			continue
		}
		if s3, _ := render(43); s3 == s1 {
			t.Fatalf("%s: different seeds, identical summaries: the seed is not used", c.name)
		}
	}
}

// TestChaosHourSoak runs the full hour-long chaos scenario (SLUICE_SOAK=1,
// `make soak`).
func TestChaosHourSoak(t *testing.T) {
	if os.Getenv("SLUICE_SOAK") == "" {
		t.Skip("set SLUICE_SOAK=1 to run the hour-long chaos scenario")
	}
	sc, err := scenarios.Load("chaos")
	if err != nil {
		t.Fatal(err)
	}
	for _, seed := range []uint64{1, 2, 3} {
		out, err := runner.Run(sc, runner.Options{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if !out.Pass() {
			t.Errorf("seed %d:\n%s", seed, report.Summary(out))
		}
		t.Logf("seed %d: %v simulated in %v", seed, out.Result.Duration, out.Wall)
	}
}

// TestShippedScenariosAcrossSeedsSoak plays every shipped scenario but
// chaos (TestChaosHourSoak plays its hour) whole, at SLUICE_SEEDS seeds
// (default 20) from SLUICE_FIRST_SEED (default 100, away from the seeds
// the scenarios and the other tests use), SLUICE_SOAK=1 only (`make
// soak`). Every run must hold the invariants, as `make test` checks them
// at one seed. The targets are what a scenario promises of its default
// seed; some are tails of a distribution over seeds (demand-shift's
// convergence in 2 epochs is 3 at about one seed in 30), so a target
// missed is listed, and the test fails when more than one run in 100
// misses one. A run in this shape found a reclaim measured to a bucket's
// TTL instead of its lease's expiry (sim/world strandedUntil): 2 misses
// in 90 runs.
func TestShippedScenariosAcrossSeedsSoak(t *testing.T) {
	if os.Getenv("SLUICE_SOAK") == "" {
		t.Skip("set SLUICE_SOAK=1 to play the shipped scenarios over many seeds")
	}
	seeds := envcount.Get(t, "SLUICE_SEEDS", 20, 1)
	first := envcount.Get(t, "SLUICE_FIRST_SEED", 100, 1)
	var mu sync.Mutex
	var runs, missing int // runs, and runs that missed a target
	var missed []string
	t.Run("scenarios", func(t *testing.T) {
		for _, name := range scenarios.Names() {
			if name == "chaos" {
				continue
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				sc, err := scenarios.Load(name)
				if err != nil {
					t.Fatal(err)
				}
				for seed := uint64(first); seed < uint64(first+seeds); seed++ {
					out, err := runner.Run(sc, runner.Options{Seed: seed})
					if err != nil {
						t.Fatal(err)
					}
					if !out.InvariantsHold() {
						t.Errorf("seed %d broke an invariant:\n%s", seed, report.Summary(out))
					}
					mu.Lock()
					runs++
					if out.InvariantsHold() && !out.Pass() {
						missing++
					}
					for _, c := range out.Checks {
						if c.Failed() && !c.Invariant {
							missed = append(missed, fmt.Sprintf("%s seed %d: %s %s (target %s)", name, seed, c.Name, c.Value, c.Target))
						}
					}
					mu.Unlock()
				}
			})
		}
	})
	slices.Sort(missed)
	for _, m := range missed {
		t.Logf("target missed: %s", m)
	}
	if allowed := (runs + 99) / 100; missing > allowed {
		t.Errorf("%d of %d runs missed a target, more than %d (one run in 100)", missing, runs, allowed)
	}
}

// BenchmarkChaosHour measures the hour-long chaos scenario (5 regions, 50
// instances, 1,000 tenants):
//
//	go test -run '^$' -bench ChaosHour -benchtime 1x ./sim/runner/
func BenchmarkChaosHour(b *testing.B) {
	sc, err := scenarios.Load("chaos")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		out, err := runner.Run(sc, runner.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(out.Counters.Events), "events")
		b.ReportMetric(out.Result.Duration.Seconds()/out.Wall.Seconds(), "virtual-s/wall-s")
	}
}

// BenchmarkSteady measures the default scenario.
func BenchmarkSteady(b *testing.B) {
	sc, err := scenarios.Load("steady")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := runner.Run(sc, runner.Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRegionOutageShowsTheDeadRegionsShareMoving: in the region-outage
// scenario the report's share chart of acme/read shows eu-west's share
// going to its floor and us-east taking it beyond its static share.
func TestRegionOutageShowsTheDeadRegionsShareMoving(t *testing.T) {
	t.Parallel()
	sc, err := scenarios.Load("region-outage")
	if err != nil {
		t.Fatal(err)
	}
	out, err := runner.Run(sc, runner.Options{Duration: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ids, svgs := report.Charts(out)
	if !slices.Contains(ids, "acme-read-shares") || !strings.Contains(svgs["acme-read-shares"], "eu-west") {
		t.Fatalf("no share chart of acme/read with eu-west in %v", ids)
	}
	s := out.Result.Series
	var f *oracle.FocusSeries
	for i := range s.Focus {
		if s.Focus[i].Key == "acme/read" {
			f = &s.Focus[i]
		}
	}
	if f == nil {
		t.Fatal("acme/read is not charted")
	}
	at := func(sec float64) int { return slices.Index(s.Times, sec) }
	usEast, euWest := f.Regions[0].Rate, f.Regions[1].Rate
	// Before: eu-west holds at least its static share (500 of 2000);
	// after recovery: nothing (partition_share 0), us-east beyond its
	// static 1000.
	if before := euWest[at(55)]; before < 499 {
		t.Errorf("eu-west's refill rate before the outage %v, want >= its static share 500", before)
	}
	for _, sec := range []float64{100, 110, 119} {
		if euWest[at(sec)] != 0 || usEast[at(sec)] <= 1000 {
			t.Errorf("at %vs: eu-west %v (want 0), us-east %v (want > 1000)", sec, euWest[at(sec)], usEast[at(sec)])
		}
	}
}

// TestConvergenceTargetJudgesOnlyWhatWasWatched: demand-shift with a
// second shift 2.5 epochs after the first meets a target of 30 epochs: the
// first shift is superseded, not "not converged within 30 epochs", and
// both the check and the summary say so with the same counts. A target
// shorter than the epochs a superseded shift was watched is missed. The
// instances report every 8 s instead of every second (and leases live
// 20 s, as a refresh must be under half of it), so their demand readings
// (windows of a tenth of that at the least) and their reports of a fall
// (checked every 2 s) follow the first shift too slowly for it to
// converge before the second (with 1 s, most seeds converge in 2 epochs
// or less; with 4 s, now in 2 as well).
func TestConvergenceTargetJudgesOnlyWhatWasWatched(t *testing.T) {
	t.Parallel()
	src, err := scenarios.Source("demand-shift")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), "      - {kind: step, at: 60s, factor: 7, regions: [ap-south]}\n",
		"      - {kind: step, at: 60s, factor: 7, regions: [ap-south]}\n      - {kind: step, at: 62500ms, factor: 1.3, regions: [eu-west]}\n", 1)
	text = strings.Replace(text, "convergence_epochs_max: 2\n", "convergence_epochs_max: 30\n", 1)
	text = strings.Replace(text, "  refresh: 1s\n", "  refresh: 8s\n", 1)
	text = strings.Replace(text, "  lease_ttl: 5s\n", "  lease_ttl: 20s\n", 1)
	sc, err := scenario.Parse([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	out, err := runner.Run(sc, runner.Options{Seed: 10})
	if err != nil {
		t.Fatal(err)
	}
	cv := out.Result.Convergence
	if cv.Shifts != 2 || cv.Superseded != 1 || cv.NotConverged != 0 || cv.Each[0].Epochs != -1 || cv.Each[0].Watched != 2 {
		t.Fatalf("convergence %+v", cv)
	}
	var check *runner.Check
	for i := range out.Checks {
		if out.Checks[i].Name == "convergence after demand shifts" {
			check = &out.Checks[i]
		}
	}
	if check == nil || !check.Pass || !strings.Contains(check.Value, "over 1 of 2 shifts") || !strings.Contains(check.Value, "1 superseded") {
		t.Fatalf("check %+v", check)
	}
	if sum := report.Summary(out); strings.Count(sum, cv.String()) != 2 || strings.Contains(sum, "within 30 epochs") {
		t.Fatalf("the summary does not say the same twice:\n%s", sum)
	}
	two := 2.0
	sc.Expect.ConvergenceEpochsMax = &two
	for _, c := range runner.Evaluate(sc, out.Result) {
		if c.Name == "convergence after demand shifts" && (c.Pass || c.NoData) {
			t.Fatalf("a shift watched 2 epochs without converging meets a target of 2: %+v", c)
		}
	}
}

// TestSameSeedSameBytesPastOneSyncBatch: an instance holding more keys
// than one Sync batch takes (500) splits its periodic Sync over several
// batches; which keys share a batch, and so when each is answered, must
// follow from the scenario and the seed, not from a map's random order.
func TestSameSeedSameBytesPastOneSyncBatch(t *testing.T) {
	t.Parallel()
	sc, err := scenario.Parse([]byte(`name: many-keys
duration: 8s
warmup: 2s
sluice: {epoch: 1s, grant_validity: 5s, lease_ttl: 5s, refresh: 1s,
  regions: {us-east: {weight: 2}, eu-west: {weight: 1}},
  classes: {read: {mode: lease, on_failure: local}},
  tiers: {free: {read: {rate: 10/s, burst: 20}}}, default_tier: free}
topology: {regions: [{name: us-east, instances: 2}, {name: eu-west, instances: 2}], global: {primary: us-east}}
workload:
  - {group: {prefix: f, count: 700, size: {dist: pareto, alpha: 1.5, min: 1/s, max: 30/s}}, class: read}
`))
	if err != nil {
		t.Fatal(err)
	}
	var sums [2]string
	for i := range sums {
		out, err := runner.Run(sc, runner.Options{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		sums[i] = report.Summary(out)
	}
	if sums[0] != sums[1] {
		t.Fatalf("same seed, different summaries:\n%s\n---\n%s", sums[0], sums[1])
	}
}

// TestFaultsThatHitNothingSayIt: a fault that finds nothing in the state
// it needs is still played and listed, and its label says what it hit:
// a crash of a region's instances when none is alive, a global leader loss
// while no leader is elected yet. They were listed as if played in full.
func TestFaultsThatHitNothingSayIt(t *testing.T) {
	doc := `name: nothing
duration: 40s
warmup: 5s
sluice:
  epoch: 1s
  grant_validity: 5s
  lease_ttl: 5s
  refresh: 1s
  regions: {us-east: {weight: 2}, eu-west: {weight: 1}}
  classes: {read: {mode: lease, on_failure: local}}
  tiers: {free: {read: {rate: 10/s, burst: 20}}}
  default_tier: free
topology:
  regions:
    - {name: us-east, instances: 2}
    - {name: eu-west, instances: 2}
  global: {primary: us-east, standby: us-east}
workload:
  - {tenant: acme, class: read, rate: {us-east: 15/s, eu-west: 9/s}}
faults:
  - {at: 10s, kind: instance-crash, region: eu-west, count: 2, restart_after: 20s}
  - {at: 12s, kind: instance-crash, region: eu-west, count: 1}
  - {at: 14s, kind: global-leader-loss}
  - {at: 14500ms, kind: global-leader-loss}
`
	sc, err := scenario.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	out, err := runner.Run(sc, runner.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var labels []string
	for _, f := range out.Result.Faults {
		labels = append(labels, f.Label)
	}
	want := []string{
		"instance-crash eu-west ×2",
		"instance-crash eu-west ×1 (hit nothing: no instance alive)",
		"global-leader-loss global-a@us-east",
		"global-leader-loss (hit nothing: no global leader)",
	}
	if !slices.Equal(labels, want) {
		t.Fatalf("fault labels:\n%s\nwant:\n%s", strings.Join(labels, "\n"), strings.Join(want, "\n"))
	}
}
