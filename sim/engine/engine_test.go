package engine

import (
	"testing"
	"time"
)

func TestEventsRunInTimeThenInsertionOrder(t *testing.T) {
	e := New(1)
	var got []int
	e.At(30, func() { got = append(got, 3) })
	e.At(10, func() { got = append(got, 1) })
	e.At(10, func() { got = append(got, 2) })
	e.At(20, func() {
		got = append(got, 20)
		e.After(0, func() { got = append(got, 21) }) // same instant, after everything queued before
		e.After(5, func() { got = append(got, 25) })
	})
	e.RunUntil(100)
	want := []int{1, 2, 20, 21, 25, 3}
	if len(got) != len(want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ran %v, want %v", got, want)
		}
	}
	if e.Now() != 100 {
		t.Fatalf("clock at %v after RunUntil(100)", e.Now())
	}
}

func TestRunUntilLeavesLaterEventsQueued(t *testing.T) {
	e := New(1)
	ran := false
	e.At(Time(2*time.Second), func() { ran = true })
	e.RunUntil(Time(time.Second))
	if ran || e.Pending() != 1 {
		t.Fatalf("event after the horizon ran=%v pending=%d", ran, e.Pending())
	}
	e.RunUntil(Time(3 * time.Second))
	if !ran {
		t.Fatal("event did not run once the horizon passed it")
	}
}

func TestSchedulingInThePastPanics(t *testing.T) {
	e := New(1)
	e.RunUntil(50)
	defer func() {
		if recover() == nil {
			t.Fatal("scheduling before now did not panic")
		}
	}()
	e.At(10, func() {})
}

func TestStreamsAreReproducibleAndIndependent(t *testing.T) {
	a1, a2 := NewStream(7, "traffic"), NewStream(7, "traffic")
	b := NewStream(7, "network")
	c := NewStream(8, "traffic")
	same, diffName, diffSeed := true, false, false
	for i := 0; i < 100; i++ {
		x, y := a1.Uint64(), a2.Uint64()
		if x != y {
			same = false
		}
		if b.Uint64() != x {
			diffName = true
		}
		if c.Uint64() != x {
			diffSeed = true
		}
	}
	if !same || !diffName || !diffSeed {
		t.Fatalf("same=%v diffName=%v diffSeed=%v", same, diffName, diffSeed)
	}
}

func TestHeapOrderUnderManyEvents(t *testing.T) {
	e := New(3)
	r := e.Stream("x")
	last := Time(-1)
	n := 0
	for i := 0; i < 5000; i++ {
		at := Time(r.Int64N(1e6))
		e.At(at, func() {
			if e.Now() < last {
				t.Fatalf("time ran backwards: %v after %v", e.Now(), last)
			}
			last = e.Now()
			n++
		})
	}
	e.RunUntil(1e6)
	if n != 5000 {
		t.Fatalf("ran %d events, want 5000", n)
	}
}
