// Package cputime reads the CPU time the kernel has accounted to this
// process or to the calling OS thread (user plus system), for benchmarks
// that compare CPU per operation on a machine other work shares: CPU time
// moves less with that work than wall time does.
//
// Units: time.Duration (nanoseconds), as accounted by getrusage(2), whose
// resolution is the kernel's (a microsecond in the figures, a scheduler
// tick in practice). The functions are safe for concurrent use.
package cputime
