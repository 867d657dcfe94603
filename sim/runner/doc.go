// Package runner runs one scenario end to end — traffic plan, oracle,
// simulated world — and judges the result against the invariants and the
// scenario's targets. The command and the tests share it.
//
// Invariant: an Outcome is a pure function of (scenario, seed, duration);
// nothing in it depends on the wall clock except Outcome.Wall, which
// reports never print in the summary.
package runner
