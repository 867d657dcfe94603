//go:build unix

package cputime

import (
	"syscall"
	"time"
)

// Process returns the CPU time of this process: every thread, the
// garbage collector's included.
func Process() (time.Duration, error) {
	return rusage(syscall.RUSAGE_SELF)
}

func rusage(who int) (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(who, &ru); err != nil {
		return 0, err
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
