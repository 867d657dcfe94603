package scenario

import (
	"fmt"

	"errors"
	"github.com/sluicehq/sluice/pkg/quota"
	"strings"
	"testing"
	"time"
)

func TestRegionDownFailoverAndEventsParse(t *testing.T) {
	s, err := Parse([]byte(minimal + `faults:
  - {at: 30s, kind: region-down, region: a, restart_after: 20s, redis_lost: true}
failovers:
  - {at: 30s, from: a, to: [b], for: 40s}
events:
  - {at: 40s, kind: drain, region: a}
  - {at: 80s, kind: restore, region: a}
expect: {recovery: 10s, recovered_vs_ideal_min: 0.97, recovered_false_rejects_max: 0.01}
`))
	if err != nil {
		t.Fatal(err)
	}
	if f := s.Faults[0]; f.Kind != FaultRegionDown || !f.RedisLost || time.Duration(f.RestartAfter) != 20*time.Second {
		t.Fatalf("fault %+v", f)
	}
	if len(s.Failovers) != 1 || s.Failovers[0].To[0] != "b" || len(s.Events) != 2 {
		t.Fatalf("failovers %+v events %+v", s.Failovers, s.Events)
	}
	short, err := s.WithDuration(35 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(short.Events) != 0 || len(short.Failovers) != 1 {
		t.Fatalf("shortened run keeps events %v failovers %v", short.Events, short.Failovers)
	}
}

func TestBadRegionDownFailoverAndEventsAreRefused(t *testing.T) {
	for _, c := range []struct{ name, doc, want string }{
		{"region-down without region", "faults: [{at: 10s, kind: region-down}]\n", "faults[0].region"},
		{"redis_lost without restart", "faults: [{at: 10s, kind: region-down, region: a, redis_lost: true}]\n", "faults[0].redis_lost"},
		{"redis_lost on another kind", "faults: [{at: 10s, kind: partition, region: a, for: 5s, redis_lost: true}]\n", "faults[0].redis_lost"},
		{"failover to itself", "failovers: [{at: 10s, from: a, to: [a]}]\n", "failovers[0].to[0]"},
		{"failover nowhere", "failovers: [{at: 10s, from: a}]\n", "failovers[0].to"},
		{"failover from unknown", "failovers: [{at: 10s, from: x, to: [b]}]\n", "failovers[0].from"},
		{"failover after the end", "failovers: [{at: 3m, from: a, to: [b]}]\n", "failovers[0].at"},
		{"failover listed twice", "failovers: [{at: 1s, from: a, to: [b, b]}]\n", "failovers[0].to[1]"},
		{"unknown event", "events: [{at: 10s, kind: explode, region: a}]\n", "events[0].kind"},
		{"event in unknown region", "events: [{at: 10s, kind: drain, region: x}]\n", "events[0].region"},
		{"every region drained", "events: [{at: 10s, kind: drain, region: a}, {at: 5s, kind: drain, region: b}]\n", "events[0]"},
		{"partitions of one region overlap", "faults: [{at: 20s, kind: partition, region: a, for: 1m}, {at: 50s, kind: partition, region: a, for: 1m}]\n",
			"faults[1]: overlaps faults[0]: two partition faults on a at once (20s–1m20s and 50s–1m50s)"},
		{"one partition inside another", "faults: [{at: 20s, kind: partition, region: a, for: 1m}, {at: 30s, kind: partition, region: a, for: 5s}]\n", "faults[1]: overlaps faults[0]"},
		{"Redis restarts overlap", "faults: [{at: 20s, kind: redis-restart, region: b, for: 30s}, {at: 40s, kind: redis-restart, region: b, for: 30s}]\n", "faults[1]: overlaps faults[0]"},
		{"etcd outages overlap", "faults: [{at: 20s, kind: etcd-down, for: 30s}, {at: 10s, kind: etcd-down, for: 15s}]\n", "faults[1]: overlaps faults[0]"},
		{"latency of one pair overlaps, ends swapped", "faults: [{at: 20s, kind: latency, region: a, peer: b, latency: 1s}, {at: 50s, kind: latency, region: b, peer: a, latency: 2s, for: 5s}]\n", "faults[1]: overlaps faults[0]"},
		{"region down while down", "faults: [{at: 20s, kind: region-down, region: a, restart_after: 30s}, {at: 40s, kind: region-down, region: a}]\n", "faults[1]: overlaps faults[0]"},
		{"more instances crashed than run", "faults: [{at: 20s, kind: instance-crash, region: b, count: 3}]\n", "faults[0].count: 3 is more than the 2 instances region b runs"},
		{"more instances stopped than run", "faults: [{at: 20s, kind: instance-stop, region: a, count: 2}]\n", "faults[0].count"},
		{"more instances isolated than run", "faults: [{at: 20s, kind: instance-isolate, region: a, count: 2, for: 5s}]\n", "faults[0].count"},
		{"chaos window left out of a run too short for it", "chaos: {mean_gap: 10s, kinds: [partition]}\n",
			"chaos.end: left out, it is the duration 2m0s − max_for 1m0s − 1m = 0s, before start 20s: set it, or run longer"},
		{"recovered target without recovery", "expect: {recovered_vs_ideal_min: 0.9}\n", "expect.recovery"},
		{"recovered target out of range", "expect: {recovery: 5s, recovered_false_rejects_max: 2}\n", "expect.recovered_false_rejects_max"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse([]byte(minimal + c.doc))
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v (scenario %v), want an error naming %s", err, s != nil, c.want)
			}
		})
	}
	// Faults of one kind one after the other, on other targets or of
	// other kinds at once, and every instance of a region, are fine.
	if _, err := Parse([]byte(minimal + `faults:
  - {at: 20s, kind: partition, region: a, for: 30s}
  - {at: 50s, kind: partition, region: a, for: 30s}
  - {at: 30s, kind: partition, region: b, for: 30s}
  - {at: 30s, kind: redis-restart, region: a, for: 30s}
  - {at: 20s, kind: latency, region: a, peer: global, latency: 1s, for: 10s}
  - {at: 25s, kind: latency, region: a, peer: b, latency: 1s, for: 10s}
  - {at: 20s, kind: instance-crash, region: b, count: 2}
  - {at: 21s, kind: instance-crash, region: b, count: 2}
  - {at: 30s, kind: instance-isolate, region: b, count: 2, for: 5s}
`)); err != nil {
		t.Fatal(err)
	}
	// Draining one region after restoring the other is fine.
	if _, err := Parse([]byte(minimal + "events: [{at: 10s, kind: drain, region: a}, {at: 20s, kind: restore, region: a}, {at: 30s, kind: drain, region: b}]\n")); err != nil {
		t.Fatal(err)
	}
}

// TestChaosDrawsNoOverlaps: chaos never schedules two faults of one kind
// on one target at once (they would be played as one ending with the
// first), neither two drawn ones nor a drawn one over a fixed one; the
// draws around them are kept, and a seed's schedule stays its own.
func TestChaosDrawsNoOverlaps(t *testing.T) {
	doc := strings.Replace(minimal, "duration: 2m", "duration: 1h", 1) +
		"faults: [{at: 10m, kind: partition, region: a, for: 20m}]\n" +
		"chaos: {mean_gap: 3s, kinds: [partition, redis-restart, latency, instance-crash], min_for: 10s, max_for: 60s}\n"
	s, err := Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	sched := s.Schedule(3)
	var p problems
	validateOverlaps(&p, sched, time.Duration(s.Duration))
	if len(p) > 0 {
		t.Fatalf("the schedule overlaps: %v", errors.Join(p...))
	}
	kinds := map[string]int{}
	for _, f := range sched {
		kinds[f.Kind]++
		if f.Kind == FaultPartition && f.Region == "a" && f.At > s.Faults[0].At && f.At < s.Faults[0].At+Instant(s.Faults[0].For) {
			t.Fatalf("a drawn partition of a at %v falls inside the fixed one", time.Duration(f.At))
		}
	}
	// Crashes hold no target: every one drawn (about 1h / 3s / 4) stays.
	if kinds[FaultInstanceCrash] < 200 || kinds[FaultPartition] < 10 || kinds[FaultRedisRestart] < 10 || kinds[FaultLatency] < 10 {
		t.Fatalf("faults by kind %v: want the draws kept where they do not overlap", kinds)
	}
}

// TestFaultFieldsThatDoNotApplyAreRefused: a field a fault's kind does not
// read is refused, naming faults[i].field and what the kind takes (a for
// on region-down was shown as an outage that ends while the region stayed
// down; a restart_after on a partition was a restart that never happened);
// every field a kind takes is accepted.
func TestFaultFieldsThatDoNotApplyAreRefused(t *testing.T) {
	for _, c := range []struct{ doc, want string }{
		{"{at: 10s, kind: region-down, region: a, for: 20s}", "faults[0].for: does not apply to kind region-down, which takes region, restart_after, redis_lost"},
		{"{at: 10s, kind: partition, region: a, for: 5s, restart_after: 10s}", "faults[0].restart_after: does not apply to kind partition"},
		{"{at: 10s, kind: partition, region: a, for: 5s, peer: b}", "faults[0].peer"},
		{"{at: 10s, kind: partition, region: a, for: 5s, latency: 1s}", "faults[0].latency"},
		{"{at: 10s, kind: partition, region: a, for: 5s, loss: 0.5}", "faults[0].loss"},
		{"{at: 10s, kind: partition, region: a, for: 5s, count: 1}", "faults[0].count"},
		{"{at: 10s, kind: instance-crash, region: a, for: 5s}", "faults[0].for"},
		{"{at: 10s, kind: instance-isolate, region: a, for: 5s, restart_after: 5s}", "faults[0].restart_after"},
		{"{at: 10s, kind: global-leader-loss, for: 5s}", "faults[0].for"},
		{"{at: 10s, kind: region-leader-loss, region: a, count: 1}", "faults[0].count"},
		{"{at: 10s, kind: etcd-down, for: 5s, loss: 0.1}", "faults[0].loss"},
		{"{at: 10s, kind: stale-leader, region: a, for: 5s, loss: 0.1}", "faults[0].loss"},
		{"{at: 10s, kind: latency, region: a, peer: b, latency: 1s, count: 2}", "faults[0].count"},
	} {
		t.Run(c.doc, func(t *testing.T) {
			_, err := Parse([]byte(minimal + "faults: [" + c.doc + "]\n"))
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %s", err, c.want)
			}
		})
	}
	s, err := Parse([]byte(minimal + `faults:
  - {at: 10s, kind: instance-crash, region: b, count: 2, restart_after: 5s}
  - {at: 11s, kind: instance-stop, region: b, count: 1, restart_after: 5s}
  - {at: 12s, kind: instance-isolate, region: b, count: 1, for: 5s}
  - {at: 13s, kind: region-leader-loss, region: a}
  - {at: 14s, kind: global-leader-loss, restart_after: 30s}
  - {at: 15s, kind: latency, region: a, peer: b, latency: 1s, for: 5s}
  - {at: 16s, kind: loss, loss: 0.1, for: 5s}
  - {at: 17s, kind: reply-loss, region: a, loss: 0.1, for: 5s}
  - {at: 18s, kind: region-report-replay, region: a, for: 5s}
  - {at: 1m, kind: region-down, region: a, restart_after: 20s, redis_lost: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Faults[0].Count != 2 || s.Faults[3].Count != 0 {
		t.Fatalf("counts %d and %d, want 2 and none (region-leader-loss takes no count)", s.Faults[0].Count, s.Faults[3].Count)
	}
}

// TestChaosDrawsEveryKindAsAFixedFaultWouldBeWritten: every kind chaos may
// be given draws faults that Validate accepts as fixed ones, a target
// named wherever the kind needs one (a region-down or instance-isolate
// drawn with no region crashed the run).
func TestChaosDrawsEveryKindAsAFixedFaultWouldBeWritten(t *testing.T) {
	for _, kind := range FaultKinds() {
		t.Run(kind, func(t *testing.T) {
			doc := strings.Replace(minimal, "duration: 2m", "duration: 1h", 1) +
				"chaos: {mean_gap: 2m, kinds: [" + kind + "], min_for: 10s, max_for: 60s}\n"
			s, err := Parse([]byte(doc))
			if err != nil {
				t.Fatal(err)
			}
			sched := s.Schedule(7)
			if len(sched) < 5 {
				t.Fatalf("%d faults drawn in an hour at a mean gap of 2m", len(sched))
			}
			fixed := *s
			fixed.Chaos, fixed.Faults = nil, sched
			if err := fixed.Validate(); err != nil {
				t.Fatalf("the drawn faults as fixed ones: %v", err)
			}
		})
	}
}

// TestCostAboveTheKeysBurstIsRefused: a workload whose cost exceeds the
// burst of a key it drives is refused naming the field and the key (such
// requests are invalid input to the limiter, never admitted: the run
// failed a sanity check no scenario sets); a cost at the burst is taken.
func TestCostAboveTheKeysBurstIsRefused(t *testing.T) {
	base := strings.Replace(minimal, "duration: 2m", "duration: 2m", 1)
	s, err := Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	w := s.Workload[0]
	r, err := s.Config.Resolve(quota.Key{Tenant: w.Tenant, Class: w.Class})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cost int64
		want string
	}{
		{r.Limit.Burst, ""},
		{r.Limit.Burst + 1, fmt.Sprintf("workload[0].cost: %d exceeds the burst %d of %s/%s", r.Limit.Burst+1, r.Limit.Burst, w.Tenant, w.Class)},
	} {
		s, err := Parse([]byte(base))
		if err != nil {
			t.Fatal(err)
		}
		s.Workload[0].Cost = tc.cost
		err = s.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("cost %d: %v, want %q", tc.cost, err, tc.want)
		}
	}
}

// TestBadShapesAreRefused: a shape field its kind does not read is refused
// as a fault's is (a hold on a step was never played), a step or flash at
// or after the end of the run as a fault there is, a diurnal period below
// MinDiurnalPeriod (1ns ran as no shape at all), steps shorter than
// MinDiurnalStep and a peak outside the period; a step's factor may be 0 (no traffic from then on), written.
func TestBadShapesAreRefused(t *testing.T) {
	doc := func(shape string) []byte {
		return []byte(strings.Replace(minimal, "rate: {a: 5/s, b: 600/m}}", "rate: {a: 5/s, b: 600/m}, shape: ["+shape+"]}", 1))
	}
	for _, c := range []struct{ shape, want string }{
		{"{kind: step, at: 20s, factor: 2, hold: 5s}", "workload[0].shape[0].hold: does not apply to kind step, which takes regions, at, factor"},
		{"{kind: step, at: 20s, factor: 2, period: 1m}", "workload[0].shape[0].period: does not apply to kind step"},
		{"{kind: flash, at: 20s, factor: 2, hold: 5s, steps: 3}", "workload[0].shape[0].steps: does not apply to kind flash"},
		{"{kind: diurnal, period: 1m, at: 5s}", "workload[0].shape[0].at: does not apply to kind diurnal"},
		{"{kind: diurnal, period: 1m, factor: 2}", "workload[0].shape[0].factor: does not apply to kind diurnal"},
		{"{kind: flash, at: 20s, factor: 2, hold: 5s, low: 0.5}", "workload[0].shape[0].low: does not apply to kind flash"},
		{"{kind: step, at: 5m, factor: 2}", "workload[0].shape[0].at: 5m0s is not before the end of the run (2m0s)"},
		{"{kind: step, at: 2m, factor: 2}", "workload[0].shape[0].at: 2m0s is not before the end of the run"},
		{"{kind: flash, at: 3m, factor: 2, hold: 5s}", "workload[0].shape[0].at: 3m0s is not before the end of the run"},
		{"{kind: step, factor: 2}", "workload[0].shape[0].at: is required for a step"},
		{"{kind: step, at: 20s}", "workload[0].shape[0].factor: is required for a step"},
		{"{kind: diurnal, period: 1ns}", "workload[0].shape[0].period: must be at least 1s, got 1ns"},
		{"{kind: diurnal, period: 30s, peaks: {a: 50s}}", "workload[0].shape[0].peaks.a: 50s is not within the period 30s"},
		{"{kind: diurnal, period: 30s, peaks: {a: 30s}}", "workload[0].shape[0].peaks.a: 30s is not within the period 30s"},
		{"{kind: diurnal, period: 1s, steps: 100000}", "workload[0].shape[0].steps: 100000 steps of the period 1s last 10µs each, under 100ms: at most 10 steps"},
		{"{kind: diurnal, period: 1m, steps: 601}", "workload[0].shape[0].steps: 601 steps of the period 1m0s"},
	} {
		t.Run(c.shape, func(t *testing.T) {
			_, err := Parse(doc(c.shape))
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
	for _, shape := range []string{
		"{kind: step, at: 20s, factor: 0, regions: [a]}",
		"{kind: flash, at: 20s, factor: 2, rise: 1s, hold: 5s, decay: 1s, regions: [b]}",
		"{kind: diurnal, period: 1s, low: 0.2, peaks: {a: 0s, b: 999ms}, steps: 4, regions: [a, b]}",
	} {
		if _, err := Parse(doc(shape)); err != nil {
			t.Errorf("%s: %v", shape, err)
		}
	}
	// A shortened run drops the steps it ends before, as it drops faults.
	s, err := Parse(doc("{kind: step, at: 20s, factor: 2}, {kind: step, at: 90s, factor: 3}"))
	if err != nil {
		t.Fatal(err)
	}
	short, err := s.WithDuration(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(short.Workload[0].Shape) != 1 || len(s.Workload[0].Shape) != 2 {
		t.Fatalf("shapes %v (original %v)", short.Workload[0].Shape, s.Workload[0].Shape)
	}
}
