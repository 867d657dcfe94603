package regional

import (
	"testing"
	"time"
)

// TestOutageLastsFromItsFirstSighting: an outage starts at its first
// sighting only, lasts from then until its end, counts every sighting,
// and once ended starts afresh; an end with none under way reports
// nothing. The log lines at an outage's end print what end returns.
func TestOutageLastsFromItsFirstSighting(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var o outage
	if _, _, ok := o.end(t0); ok {
		t.Fatal("an end with no outage under way reported one")
	}
	for i, want := range []bool{true, false, false} {
		if starts := o.see(t0.Add(time.Duration(i) * time.Second)); starts != want {
			t.Fatalf("sighting %d: starts %v, want %v", i+1, starts, want)
		}
	}
	lasted, seen, ok := o.end(t0.Add(5 * time.Second))
	if !ok || lasted != 5*time.Second || seen != 3 {
		t.Fatalf("end: lasted %v, seen %d, ok %v; want 5s, 3, true", lasted, seen, ok)
	}
	if _, _, ok := o.end(t0.Add(6 * time.Second)); ok {
		t.Fatal("a second end reported the outage again")
	}
	if !o.see(t0.Add(7 * time.Second)) {
		t.Fatal("a sighting after the end did not start a new outage")
	}
	if lasted, seen, ok := o.end(t0.Add(9 * time.Second)); !ok || lasted != 2*time.Second || seen != 1 {
		t.Fatalf("the second outage: lasted %v, seen %d, ok %v; want 2s, 1, true", lasted, seen, ok)
	}
}
