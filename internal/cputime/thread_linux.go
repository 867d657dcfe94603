package cputime

import (
	"syscall"
	"time"
)

// Thread returns the CPU time of the calling OS thread (lock the goroutine
// to it with runtime.LockOSThread around what is measured); the garbage
// collector's own threads are not in it.
func Thread() (time.Duration, error) {
	return rusage(syscall.RUSAGE_THREAD)
}
