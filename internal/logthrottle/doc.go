// Package logthrottle decides which of a run of like events are logged:
// the first of each key, then at most one per interval, each logged line
// carrying how many were left out since the one before. The daemons'
// counters say how many events there were; one line per interval says it
// as well as thousands.
//
// Invariant: a key is logged at most once per interval. Times are the
// caller's (explicit now).
package logthrottle
