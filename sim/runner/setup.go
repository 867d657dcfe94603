package runner

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/sim/oracle"
	"github.com/sluicehq/sluice/sim/scenario"
	"github.com/sluicehq/sluice/sim/traffic"
	"github.com/sluicehq/sluice/sim/world"
)

// Setup is what one run of a scenario starts from, whichever mode plays
// it: the scenario with the run's options applied, the seed, the traffic
// plan and the oracle that judges the run. Run (virtual time) and
// sim/live's Run (the real daemons) both start from NewSetup and end with
// Outcome, so both modes play the same traffic and are judged the same
// way.
type Setup struct {
	Scenario *scenario.Scenario
	Seed     uint64
	Plan     *traffic.Plan
	Oracle   *oracle.Oracle
}

// NewSetup applies opts to sc, builds its traffic plan and sets up its
// oracle.
func NewSetup(sc *scenario.Scenario, opts Options) (*Setup, error) {
	sc, seed, err := Prepare(sc, opts)
	if err != nil {
		return nil, err
	}
	plan, err := traffic.Build(sc, seed)
	if err != nil {
		return nil, fmt.Errorf("traffic: %w", err)
	}
	os, err := world.OracleSetup(sc, plan)
	if err != nil {
		return nil, err
	}
	os.Changes = Changes(sc, seed, opts)
	orc, err := oracle.New(os)
	if err != nil {
		return nil, err
	}
	return &Setup{Scenario: sc, Seed: seed, Plan: plan, Oracle: orc}, nil
}

// Changes are the disturbances of a run with the given seed, for the
// oracle's recovered measures: every fault's start, its end (For) and its
// restart (RestartAfter), every failover and its return, every event;
// not those opts say the mode skips.
func Changes(sc *scenario.Scenario, seed uint64, opts Options) []oracle.Change {
	var out []oracle.Change
	end := time.Duration(sc.Duration)
	add := func(at time.Duration, label string) {
		if at < end {
			out = append(out, oracle.Change{At: at, Label: label})
		}
	}
	for _, f := range sc.Schedule(seed) {
		if opts.Skipped != nil && opts.Skipped(f) != "" {
			continue
		}
		label := f.Kind
		if f.Region != "" {
			label += " " + f.Region
		}
		at := time.Duration(f.At)
		add(at, label)
		if f.For > 0 {
			add(at+time.Duration(f.For), label+" ends")
		}
		if f.RestartAfter > 0 {
			add(at+time.Duration(f.RestartAfter), label+" restarts")
		}
	}
	for _, f := range sc.Failovers {
		label := fmt.Sprintf("failover %s → %s", f.From, strings.Join(f.To, ", "))
		add(time.Duration(f.At), label)
		if f.For > 0 {
			add(time.Duration(f.At)+time.Duration(f.For), label+" back")
		}
	}
	for _, e := range sc.Events {
		add(time.Duration(e.At), e.Kind+" "+e.Region)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	// Changes at one instant are one disturbance.
	merged := out[:0]
	for _, c := range out {
		if n := len(merged); n > 0 && merged[n-1].At == c.At {
			merged[n-1].Label += "; " + c.Label
			continue
		}
		merged = append(merged, c)
	}
	return merged
}

// Outcome is the run's outcome in mode ("virtual" or "live"), judged from
// res, the oracle's finished result: the deployment's size and every check
// of Evaluate.
func (s *Setup) Outcome(mode string, res *oracle.Result) *Outcome {
	out := &Outcome{Scenario: s.Scenario, Seed: s.Seed, Mode: mode, Result: res,
		Instances: Instances(s.Scenario), Tenants: Tenants(s.Plan)}
	out.Checks = Evaluate(s.Scenario, res)
	return out
}
