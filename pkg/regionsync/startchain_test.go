package regionsync

import (
	"slices"
	"testing"
)

// TestStartChain: a process starting on a config other than the one last
// confirmed to its region starts with that one confirmed and its own
// adopted since, as a process that ran through the change has: its share
// is the smaller of the two until the global tier confirms its revision,
// so a region restarted onto a raised weight while another still runs the
// old one keeps Σ static rates ≤ r. With no stored revision, the same
// revision, a static config, or the confirmed config unknown, the config
// it starts on counts as confirmed.
func TestStartChain(t *testing.T) {
	old := chainConfig(t, [3]float64{1, 1, 2}, 100, 100)   // eu 25/s, us 50/s
	grown := chainConfig(t, [3]float64{1, 2, 1}, 100, 100) // eu 50/s, us 25/s
	rate := func(c Chain, region string) float64 { r, _ := share(t, c, region); return r }

	for _, tc := range []struct {
		name      string
		confirmed Revision
		live      Revision
	}{
		{"fresh region: nothing stored", Revision{}, Revision{20, grown}},
		{"started on the confirmed config", Revision{20, grown}, Revision{20, grown}},
		{"static config", Revision{10, old}, Revision{0, grown}},
		{"confirmed config unreadable", Revision{10, nil}, Revision{20, grown}},
	} {
		c := StartChain([]Revision{tc.confirmed}, tc.live)
		if c.Len() != 1 || c.Confirmed() != tc.live.Rev || c.Current().Cfg != tc.live.Cfg {
			t.Errorf("%s: chain of %d configs confirmed at %d, want the live one alone (%d)", tc.name, c.Len(), c.Confirmed(), tc.live.Rev)
		}
		want := tc.confirmed.Rev != 0 && tc.live.Rev != 0 && tc.confirmed.Rev != tc.live.Rev
		if got := NeedsHistory(tc.confirmed.Rev, tc.live.Rev); got != want {
			t.Errorf("%s: NeedsHistory(%d, %d) = %v, want %v", tc.name, tc.confirmed.Rev, tc.live.Rev, got, want)
		}
	}

	// eu restarts onto the raised weight; us still runs the old config.
	if c := StartChain(nil, Revision{20, grown}); c.Len() != 1 || c.Confirmed() != 20 {
		t.Errorf("no history: chain of %d configs confirmed at %d, want the live one alone", c.Len(), c.Confirmed())
	}
	eu, us := StartChain([]Revision{{10, old}}, Revision{20, grown}), NewChain(10, old)
	if eu.Len() != 2 || eu.Confirmed() != 10 || eu.Current().Rev != 20 {
		t.Fatalf("eu's chain: %d configs confirmed at %d running %d, want 2, 10, 20", eu.Len(), eu.Confirmed(), eu.Current().Rev)
	}
	if r := rate(eu, "eu"); r > 25.0001 {
		t.Fatalf("eu restarted onto its raised weight runs %v/s at once, want the old 25/s", r)
	}
	if sum := rate(eu, "eu") + rate(us, "us"); sum > 100.0001 {
		t.Fatalf("Σ static rates %v above r = 100", sum)
	}
	eu, revs := eu.Reported()
	if !slices.Equal(revs, []int64{10, 20}) {
		t.Fatalf("eu reports %v, want [10 20]", revs)
	}
	us = us.Adopt(20, grown) // us adopts its smaller weight; revision 20 is confirmed
	eu = eu.Confirm(20)
	if r := rate(eu, "eu"); r < 49.999 {
		t.Fatalf("eu runs %v/s once revision 20 is confirmed, want 50", r)
	}
	if sum := rate(eu, "eu") + rate(us, "us"); sum > 100.0001 {
		t.Fatalf("Σ static rates %v above r = 100 after the confirmation", sum)
	}

	// A process starting on an older config than the one confirmed (a
	// stale read) is bounded by both too.
	c := StartChain([]Revision{{20, grown}}, Revision{10, old})
	if c.Len() != 2 || c.Confirmed() != 20 || c.Current().Rev != 10 || rate(c, "us") > 25.0001 {
		t.Fatalf("started on revision 10 with 20 confirmed: %d configs confirmed at %d running %d, us at %v/s, want 2, 20, 10, 25/s",
			c.Len(), c.Confirmed(), c.Current().Rev, rate(c, "us"))
	}

	// Revision 15 was confirmed (us and ap run it) but eu's leader had not
	// stored that yet when eu restarted onto revision 20: the configs
	// committed between the stored revision and eu's bound it too.
	shrunk := chainConfig(t, [3]float64{1, 1, 6}, 100, 100) // ap 12.5/s, eu 12.5/s, us 75/s
	eu = StartChain([]Revision{{10, old}, {15, shrunk}}, Revision{20, grown})
	us, ap := NewChain(15, shrunk), NewChain(15, shrunk)
	if eu.Len() != 3 || eu.Confirmed() != 10 || eu.Current().Rev != 20 {
		t.Fatalf("eu's chain: %d configs confirmed at %d running %d, want 3, 10, 20", eu.Len(), eu.Confirmed(), eu.Current().Rev)
	}
	if sum := rate(eu, "eu") + rate(us, "us") + rate(ap, "ap"); sum > 100.0001 {
		t.Fatalf("Σ static rates %v above r = 100 with revision 15 confirmed", sum)
	}
	if c := StartChain([]Revision{{10, old}}, Revision{20, grown}); rate(c, "eu")+rate(us, "us")+rate(ap, "ap") <= 100.0001 {
		t.Fatalf("without revision 15 eu runs %v/s: the case above proves nothing", rate(c, "eu"))
	}
}

// TestStartChainSkipsHistoryWithoutAConfigAndTheLiveRevision: a revision
// of the history that carries no config (nothing to run, nothing any
// region ran there) bounds nothing, and the history's copy of the live
// revision is not adopted in place of the live config: the chain is the
// confirmed config and the live one, running the live config itself.
func TestStartChainSkipsHistoryWithoutAConfigAndTheLiveRevision(t *testing.T) {
	old := chainConfig(t, [3]float64{1, 1, 2}, 100, 100)   // eu 25/s
	grown := chainConfig(t, [3]float64{1, 2, 1}, 100, 100) // eu 50/s
	stale := chainConfig(t, [3]float64{1, 2, 1}, 100, 100) // revision 20 read back: another copy
	c := StartChain([]Revision{{10, old}, {15, nil}, {20, stale}}, Revision{20, grown})
	if c.Len() != 2 || c.Confirmed() != 10 || c.Current().Rev != 20 || c.Current().Cfg != grown {
		t.Fatalf("chain of %d configs confirmed at %d running %+v, want 2 confirmed at 10 running the live config of 20",
			c.Len(), c.Confirmed(), c.Current())
	}
	if r, _ := share(t, c, "eu"); r < 24.999 || r > 25.001 {
		t.Fatalf("eu runs %v/s, want 25 (a revision without a config counts for nothing)", r)
	}
}
