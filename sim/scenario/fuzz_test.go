package scenario

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// FuzzParse: a scenario document is either refused with an error wrapping
// ErrInvalid or accepted as one that runs: validating it again accepts it,
// its faults fall within the run, its schedule is the same for the same
// seed, and it can be shortened (the simulator's -duration) into a valid
// scenario whose faults fall within the shorter run. The seeds are every
// shipped scenario and the documents of this package's tests.
func FuzzParse(f *testing.F) {
	shipped, err := filepath.Glob(filepath.Join("..", "scenarios", "*.yaml"))
	if err != nil || len(shipped) == 0 {
		f.Fatalf("no shipped scenarios to seed from: %v", err)
	}
	for _, path := range shipped {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(minimal))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("refusal does not wrap ErrInvalid: %v", err)
			}
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("an accepted scenario fails validation again: %v", err)
		}
		dur := time.Duration(s.Duration)
		if dur <= 0 {
			t.Fatalf("accepted a run of %v", dur)
		}
		const seed = 7
		sched := s.Schedule(seed)
		for i, fault := range sched {
			if at := time.Duration(fault.At); at < 0 || at > dur {
				t.Fatalf("fault %d (%s) starts at %v, outside the %v run", i, fault.Kind, at, dur)
			}
			if i > 0 && fault.At < sched[i-1].At {
				t.Fatalf("schedule not in start order at %d: %v after %v", i, time.Duration(fault.At), time.Duration(sched[i-1].At))
			}
		}
		var overlaps problems
		if validateOverlaps(&overlaps, sched, dur); len(overlaps) > 0 {
			t.Fatalf("the schedule plays overlapping faults: %v", errors.Join(overlaps...))
		}
		if again := s.Schedule(seed); !reflect.DeepEqual(again, sched) {
			t.Fatalf("the same seed gave two schedules:\n%v\n%v", sched, again)
		}
		half := dur / 2
		if half <= 0 {
			return
		}
		short, err := s.WithDuration(half)
		if w := time.Duration(s.Warmup); !s.warmupDefault && w > 0 && half <= w {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("shortening a run with warmup %v to %v: %v, want a refusal", w, half, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("shortening an accepted %v run to %v: %v", dur, half, err)
		}
		for _, fault := range short.Faults {
			if time.Duration(fault.At) >= half {
				t.Fatalf("the %v run keeps a fault at %v", half, time.Duration(fault.At))
			}
		}
	})
}
