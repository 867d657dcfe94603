package allocator

import (
	"syscall"
	"time"
)

// threadCPU is the CPU time the calling OS thread has used (lock the
// goroutine to it).
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
