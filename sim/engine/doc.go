// Package engine is the simulator's discrete-event core: a virtual clock,
// an event queue and seeded random streams. Nothing in it reads the wall
// clock, so a run is a pure function of its inputs and seed.
//
// # Invariants
//
//   - Virtual time never runs backwards: events run in (time, insertion
//     order) order, and scheduling an event in the past is a programming
//     error that panics.
//   - Two events at the same instant run in the order they were scheduled,
//     so ties never depend on map iteration or goroutine timing.
//   - Every random stream is derived from the run's seed and a stream
//     name, so adding a stream never changes the numbers another one draws.
//
// # Units
//
// Time is virtual nanoseconds since the start of the run (type Time);
// durations are time.Duration.
package engine
