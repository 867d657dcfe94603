// Package regionsync holds every decision of the sync between a region and
// the global tier, with no I/O and no clock: times come in as arguments
// (Redis time in µs on the region's side), and state reads and writes are
// done by the caller.
//
// The region leader side: Leader builds a region's report from the keys'
// states (seq, demand baselines, held grants echoed bit for bit, the rate
// held at send time), Installs turns the global tier's answer into the
// set_rate calls to make (expiry = send time + validity) and Round decides
// what follows an answer (an acknowledgement when a grant was lowered,
// catch-up reports while a raise is pending), Moved (rise.go) and Fresh
// (fresh.go) decide between epochs whether a watched key's rise, a granted
// key's fall or a newly marked key is worth a report now, and StaticLease (static.go)
// decides how long the region may run on its static shares: from the
// answers' static_lease_ms and, with no global leader elected, from etcd;
// each replica then chooses per key its static share or its floor
// (Chain.Leased). Leader also carries the tokens lowered caps released to
// the next report that finds their grant still held (the burst transfer:
// Installed, Report; docs/architecture.md, "Burst transfer"), and Installs
// passes each grant's deposit to set_rate. The global side: DecodeReport
// checks a wire report and converts it for pkg/hierarchy, EncodeGrants
// writes the answer.
//
// pkg/regional's Leader and pkg/allocator's Service are pumps around these
// functions (Redis pipelines, gRPC, timers); the simulator (sim/world) is a
// second pump around the same functions over its Redis twin and simulated
// links. A decision made anywhere else is a bug.
package regionsync
