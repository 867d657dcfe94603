// Package observability holds Sluice's Prometheus rules (alerts.yaml) and
// Grafana dashboard (dashboard.json). It has no Go API; its tests hold the
// two files to the code.
//
// Invariant: every series an alert, a recording rule, a panel or a
// dashboard variable selects is exported by the code. The tests build the
// real components in process (regional.New, lease.NewClient,
// configstore.NewWatcher, envoyrls.New with a recording prometheus.Registerer,
// and a global allocator daemon on an embedded etcd), list the families
// they export, and read every PromQL expression with Prometheus's own
// parser (run by the program in ./promql, a module of its own):
// each selected name must be an exported family (histograms only through
// their _bucket, _sum and _count series) or a series recorded by the rule
// file; each matcher and grouping label must be a label those series
// carry (or a scrape target label: job, instance, namespace, pod); a
// matched value of a label the code fills (result, code, method, script,
// path, degraded) must be a string literal of the package that exports the
// series, a gRPC code name or a boolean; rate, irate and increase must be
// given counters. Every alert has a for, labels.severity,
// annotations.summary, description and a runbook_url whose anchor is a
// section of docs/operations.md; the dashboard's panel ids are unique and
// every panel has a target. testdata/alerts_test.yaml holds promtool unit
// tests: for every alert, input series on which it fires and on which it
// stays silent (run when promtool is installed; make deps installs it).
//
// Units: metric durations are seconds, rates per second, ratios in [0, 1];
// alert thresholds use the same units (a 5 ms budget is 0.005).
package observability
