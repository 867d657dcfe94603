// Package report renders a simulator outcome: a plain-text summary (the
// table the command prints), a self-contained HTML page with inline SVG
// charts (no scripts, no external fonts or styles), the charts as
// standalone SVG files, and the time series as CSV.
//
// Invariant: every rendering is a pure function of the outcome, except
// that Summary leaves out Outcome.Wall; the same scenario and seed give a
// byte-identical summary, page, charts and CSV.
//
// Units: rates in charts and CSV are tokens per second averaged over the
// series step; times are seconds since the start of the run.
package report
