// Package traffic turns a scenario's workload into arrival streams: one
// per (key, region), each with an expected request rate that varies over
// time (steps, diurnal follow-the-sun cycles, flash crowds) and a seeded
// arrival process (Poisson or evenly spaced) that is sampled in batches.
//
// # Invariants
//
//   - A stream's arrivals are a pure function of the seed, the stream's
//     identity and the sequence of Next calls: the same scenario and seed
//     give the same arrivals.
//   - A batch never straddles a breakpoint of its rate (a step, a phase
//     of a flash crowd, a diurnal step), so steps are exact in time.
//   - Batches are sized so that a stream makes at most 1/MinBatch events
//     per second however high its rate, and at least one per MaxBatch
//     while its rate is positive: the cost of a simulation grows with the
//     number of streams, not with the number of requests.
//
// # Units
//
// Rates are requests per second; every request of a stream costs Cost
// tokens; times are offsets from the start of the run (time.Duration).
package traffic
