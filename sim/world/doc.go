// Package world is the simulated Sluice deployment: the real global
// allocator (pkg/hierarchy), the real instance-side lease state machine
// (pkg/lease Table and Breaker) and the Go twin of the regional Lua
// scripts (pkg/luascripts Model), wired together by simulated links on the
// virtual clock of package engine. Only the thin adapters are simulated:
// the regional service's request handling and region-leader loop mirror
// pkg/regional (server.go, leader.go), the instance's owner loop mirrors
// pkg/lease's Client, and etcd is a model of sessions and elections.
//
// # Invariants
//
//   - Every node reads only its own clock: true time plus a fixed offset
//     per region (and per instance). Grants expire on the region's clock
//     from the send time of the report they answer; leases on the
//     instance's clock from the send time of the request.
//   - A run is a pure function of the scenario and the seed: events run in
//     (time, insertion) order, random draws come from named seeded streams,
//     and no decision depends on map iteration order (the lease tables
//     walk their keys in key order: TableOptions.OrderedScans).
//   - Everything observable goes to the oracle as it happens: offered and
//     decided tokens, every grant a region's bucket applies, Redis
//     outages, crash errors, reclaims, RPCs and faults.
//
// # Units
//
// Virtual time is engine.Time (ns since the start); tokens are int64 on the
// lease path and float64 in buckets; rates tokens per second; Redis times
// are microseconds on the region's clock.
package world
