// Command sim is Sluice's deterministic multi-region traffic and failure
// simulator: it runs the real allocator (pkg/hierarchy), the real
// instance-side lease state machine (pkg/lease) and the Go twin of the
// regional Lua scripts (pkg/luascripts) on virtual time, injects the
// failures a scenario names, checks DESIGN §2's invariants continuously and
// writes a report.
//
//	go run ./sim                         # the default scenario
//	go run ./sim -list                   # shipped scenarios
//	go run ./sim -scenario flash-crowd -seed 7 -duration 2m -out sim-out
//	go run ./sim -scenario my.yaml       # a scenario file
//	go run ./sim -live -scenario steady  # the same against real daemons
//	go run ./sim -scenario scale-10m     # 10,000,000 keys at epoch granularity (sim/scale)
//
// The summary goes to stdout; report.html, summary.txt, timeseries.csv and
// one SVG per chart go to -out, replacing the files the last run wrote
// there (listed in .sim-files; nothing else is removed). The same scenario
// and seed always give the same summary.
//
// Exit status: 0 when the invariants held and every target was met, 1 when
// an invariant was violated, 3 when only a target was missed, 2 on bad
// usage or input, 130 when interrupted (SIGINT: the run stops at its next
// event and writes nothing).
package main
