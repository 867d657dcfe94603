// Package live plays a scenario against the real daemons in one process:
// an embedded etcd, a Redis per region (a redis-server child process, or an
// embedded Redis with a warning when none is installed), two regional
// daemons per region (one leads it), two global allocator daemons (leader
// and standby) and one lease client per instance, all talking gRPC on
// loopback. The deployment is internal/devcluster's, the one development
// mode runs, on the scenario's config: as a static config, or, when the
// scenario has operator events, watched in etcd, where the events write
// their revisions (events.go). The run starts
// from runner.NewSetup, as a virtual run does: the same traffic plan, fault
// schedule and oracle judge it.
//
// # Time scale
//
// Scale s plays s scenario seconds per wall second: the Sluice config's
// durations are divided by s and its rates multiplied by s, arrival rates
// likewise, and every observation is stamped (wall elapsed) × s, so the
// oracle sees the scenario's own units. The etcd session TTL cannot go
// below one whole second, so elections take relatively longer at large s.
//
// # What is observed
//
// Every decision of every lease client goes to the oracle as it returns;
// every grant a region's Redis applies goes to it from the region leader
// (LeaderOptions.OnApplied) before the leader's next report, and a grant
// applied whose answer the leader never got (a call that timed out after
// Redis ran it) from the state read of that next report
// (LeaderOptions.OnHeld, with the expiry Redis stores), before the global
// tier sees the report; every static
// share a replica runs on goes to it when the replica stores a new chain
// of configs (Options.OnChain), before it serves anything under it, a
// region's being the larger of its replicas'. A donor's
// smaller grant is therefore seen before the global tier can give the
// difference to a recipient, so the oracle's order of grants is the order
// that matters. (Polling Redis for grants instead sees a recipient's new
// grant before a donor's now and then, an oversubscription that never
// happened.) The grants the global daemons sent, applied or not, are read
// from their metrics at the end of the run (Result.GrantsSent): a run whose
// global tier never led out of learning mode sends none.
//
// The latest grant events of every key (each report's echo of what the
// region holds, the global tier's answers or their loss, the grants
// applied) are kept per key (trace.go); when invariant 2 or 3 fails, the
// first violating key's events from three validities before the violation
// go to Options.Log, so a failure on a loaded machine can be read.
//
// # Faults
//
// Instance crashes (the client's connection is cut, nothing released),
// graceful stops (Client.Close), global leader loss (the leading daemon is
// stopped; it resigns, so the standby takes over at once, faster than a
// crash would allow), region leader loss (each region runs two regional
// daemons that instances reach as applications do, lease.ServiceConfig:
// round robin, a lease RPC cut by a stop sent once more to the other; the
// leading one loses its etcd client and stops without resigning, so the
// other is elected once the session lapses, and a replacement starts at
// the same address),
// partitions, latency and loss between a region and the global tier
// (injected in the region leader's GlobalTier), Redis restarts (the
// process is killed and restarted empty on the same port) and etcd outages
// (the embedded etcd is shut down and started again on the same data and
// addresses), and whole-region deaths (region-down: the region's
// instances crash, both regional daemons and the global replica placed in
// the region are killed, its link to the global tier is cut, its Redis
// stopped when lost; restart_after brings each back; the oracle learns the
// region's static lease from its leaders, static.go). The operator's
// events (drain, restore) are config revisions written to etcd at their
// times. The exactly-once faults act on the real RPCs (leasefaults.go,
// tier.go): an instance's lease call applied with its answer lost, a
// copy of it delivered again up to two refreshes later, a region report
// delivered to the global tier twice (a differing answer fails invariant
// 5), and isolated instances, whose leases are read from Redis each epoch
// so that what a reaped one gave back unreported counts as ε
// (isolate.go). A stale leader cannot be frozen in process: it is killed
// after its installed grants are read from Redis, and its wake is played
// by installing them again through set_rate, planned by a live replica
// (stale.go); Redis must refuse each one a newer leader superseded, which
// the oracle's grant order check judges. Latency between two regions has
// no path to act on here and is skipped: the fault list names it as
// skipped at its time, and no recovery is measured after it (Skipped).
//
// # Whether the machine kept up
//
// Arrivals are stamped when delivered, so a driver the machine starves
// delivers late and bunches arrivals up. The driver books its lateness
// (pace.go) and the outcome carries a warning (runner.Outcome.Warnings)
// when more than 1% of requests came over 100 ms of scenario time late, or
// an instance too far behind had requests denied undecided.
//
// # What is not checked
//
// The per-region bucket checks (holding within the cap, exactly-once
// counters, grants applied in order) read Redis after every script call,
// which only virtual mode can do: here they read n/a. The control plane's
// Redis figure is the daemons' round trips to Redis (a Sync's pipelined
// scripts count once, with their own pings and reads), not scripts.
//
// Not safe for concurrent use: Run owns everything it starts and stops it
// before returning.
package live
