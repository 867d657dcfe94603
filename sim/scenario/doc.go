// Package scenario is the simulator's input: a YAML document naming the
// Sluice configuration to run (validated by pkg/config, exactly as the
// daemons would), the topology it runs on (regions, instances, clock
// offsets, link latencies), the traffic offered per region and tenant, the
// faults injected at given times, and the targets the run must meet.
//
// # Invariant
//
// A *Scenario returned by Parse or Load has passed Validate: every region
// of the topology is a region of the Sluice config and back, every class
// is configured, every time and rate is finite and in range, every
// fault names things that exist (no more instances than its region runs),
// and no two faults of one kind that hold their target for a time
// (partition, redis-restart, etcd-down, latency of one pair, loss,
// reply-loss, report-replay, region-report-replay, stale-leader,
// region-down) overlap on one target; Schedule keeps it so for the faults
// chaos draws (one that would overlap is not played). Validation reports all problems at once,
// once, naming its field path (workload[2].rate.eu-west) and the line
// of the document it is on ("invalid scenario: workload[2].rate.eu-west:
// ... (line 31)"), and wrapping ErrInvalid.
//
// # Defaults
//
// A field left out takes its default; a default never replaces a value
// written. A field written 0 where 0 is no value it takes (seed, a
// workload's cost and per_instance, a group's regions and its size's
// alpha, sigma and max, a fault's count, client.breaker_failures,
// expect.convergence_tolerance, any duration but warmup) is refused,
// naming it; warmup: 0s measures from the start.
//
// # Units
//
// Durations are written "1s", "250ms"; rates "10/s", "600/m" or a bare
// number per second (the config package's syntax); request rates are
// requests per second and every request costs Cost tokens. Times of shapes
// and faults are offsets from the start of the run.
package scenario
