package runner

import (
	"fmt"

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
	orc, err := oracle.New(os)
	if err != nil {
		return nil, err
	}
	return &Setup{Scenario: sc, Seed: seed, Plan: plan, Oracle: orc}, nil
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
