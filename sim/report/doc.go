// Package report renders a simulator outcome: a plain-text summary (the
// table the command prints), a self-contained HTML page with inline SVG
// charts (no scripts, no external fonts or styles), the charts as
// standalone SVG files, and the time series as CSV.
//
// Invariant: every rendering is a pure function of the outcome, except
// that Summary leaves out Outcome.Wall; the same scenario and seed give a
// byte-identical summary, page, charts and CSV.
//
// Units: offered, admitted, denied and ideal rates in charts and CSV are
// tokens per second averaged over the series step; refill rates and burst
// caps are sampled at the step's end; times are seconds since the start
// of the run (a CSV row's t_s is its step's end).
package report
