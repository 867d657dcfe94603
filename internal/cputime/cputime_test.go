package cputime

import (
	"runtime"
	"testing"
)

// TestCPUTimeGrowsWithWork: spinning on the locked thread raises both the
// thread's and the process's CPU time, the thread's by no more than the
// process's.
func TestCPUTimeGrowsWithWork(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p0, err := Process()
	if err != nil {
		t.Fatal(err)
	}
	t0, err := Thread()
	if err != nil {
		t.Skipf("thread CPU time: %v", err)
	}
	// Spin until the thread's CPU time has moved (the kernel accounts in
	// ticks), at most a few billion iterations.
	var t1 = t0
	x := uint64(1)
	for i := 0; i < 1<<32 && t1 == t0; i++ {
		x = x*6364136223846793005 + 1
		if i%(1<<20) == 0 {
			if t1, err = Thread(); err != nil {
				t.Fatal(err)
			}
		}
	}
	p1, err := Process()
	if err != nil {
		t.Fatal(err)
	}
	if t1 <= t0 || p1 <= p0 {
		t.Fatalf("after spinning (%d): thread %v → %v, process %v → %v; want both to grow", x, t0, t1, p0, p1)
	}
	if t1-t0 > p1-p0 {
		t.Fatalf("the thread's CPU time grew %v, more than the process's %v", t1-t0, p1-p0)
	}
}
