package regionsync

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestRisenWatchesContendedKeysOnly: the report decides which keys are
// watched (a grant, or demand at half the static share), and a read
// between epochs is a rise only when a key asks for materially more than
// both its rate and what was last reported.
func TestRisenWatchesContendedKeysOnly(t *testing.T) {
	hot := quota.Key{Tenant: "acme", Class: "write"}
	donor := quota.Key{Tenant: "globex", Class: "write"}
	idle := quota.Key{Tenant: "initech", Class: "write"}
	epoch := time.Second
	l := NewLeader()
	now := int64(1_700_000_000_000_000)
	read := func(k quota.Key, demand, rate float64, granted bool) KeyRead {
		st := luascripts.State{Rate: rate, Cap: rate, LeaseDemand: demand, NowUS: now}
		if granted {
			st.GrantExpiryUS = now + 5_000_000
		}
		return KeyRead{Key: k, State: st, StaticRate: 333}
	}
	l.Report("ap", now, epoch, Epoch, []KeyRead{
		read(hot, 400, 333, false), // above half its static share
		read(donor, 150, 150, true),
		read(idle, 10, 333, false),
	})
	if got := l.Watched(); len(got) != 2 || got[0] != hot || got[1] != donor {
		t.Fatalf("watched %v, want [%v %v]", got, hot, donor)
	}
	for _, tc := range []struct {
		name string
		read KeyRead
		want bool
	}{
		{"unchanged", read(donor, 150, 150, true), false},
		{"noise", read(donor, 180, 150, true), false},
		{"the donor's demand jumps", read(donor, 1050, 150, true), true},
		{"a rise within the rate held", read(hot, 420, 600, true), false},
		{"above the rate but not what was reported", read(hot, 420, 333, false), false},
	} {
		if got, _ := l.Moved(epoch, []KeyRead{tc.read}); got != tc.want {
			t.Errorf("%s: risen %v, want %v", tc.name, got, tc.want)
		}
	}
	// A new leadership watches nothing until it reports.
	l.Elected()
	if len(l.Watched()) != 0 {
		t.Fatal("a new leadership watches keys it never reported")
	}
}

// TestWatchedAtHalfTheShareAndBounded: a key is watched from exactly half
// the region's static share of demand (a hair below is not), and at most
// MaxWatched keys are watched, the first of the report's order.
func TestWatchedAtHalfTheShareAndBounded(t *testing.T) {
	now := int64(1_700_000_000_000_000)
	at := func(k quota.Key, demand float64) KeyRead {
		return KeyRead{Key: k, StaticRate: 300, State: luascripts.State{Rate: 300, Cap: 300, LeaseDemand: demand, NowUS: now}}
	}
	half := quota.Key{Tenant: "acme", Class: "write"}
	below := quota.Key{Tenant: "globex", Class: "write"}
	third := quota.Key{Tenant: "initech", Class: "write"}
	l := NewLeader()
	l.Report("ap", now, time.Second, Epoch, []KeyRead{at(half, 150), at(below, math.Nextafter(150, 0)), at(third, 100)})
	if got := l.Watched(); !slices.Equal(got, []quota.Key{half}) {
		t.Fatalf("watched %v, want only %v (demand exactly half the share)", got, half)
	}
	reads := make([]KeyRead, MaxWatched+10)
	for i := range reads {
		reads[i] = at(quota.Key{Tenant: fmt.Sprintf("t%04d", i), Class: "write"}, 1000)
	}
	l.Report("ap", now+1_000_000, time.Second, Epoch, reads)
	got := l.Watched()
	if len(got) != MaxWatched || got[0] != reads[0].Key || got[MaxWatched-1] != reads[MaxWatched-1].Key {
		t.Fatalf("watched %d keys (%v … ), want the first %d", len(got), got[:min(len(got), 2)], MaxWatched)
	}
}

// TestRisenAtItsThresholds: a rise must exceed both the rate held and
// the demand last reported by more than a tenth of the static share and
// by more than three standard deviations of a Poisson count over half an
// epoch (3·√(d/(epoch/2))); exactly at either threshold is no rise.
func TestRisenAtItsThresholds(t *testing.T) {
	k := quota.Key{Tenant: "acme", Class: "write"}
	now := int64(1_700_000_000_000_000)
	const epoch = time.Second // half an epoch: 0.5 s
	for _, c := range []struct {
		name                      string
		static, reported, rate, d float64
		want                      bool
	}{
		// A tenth of the share (1000) is above the noise (3·√2000 ≈ 134).
		{"exactly a tenth of the share above", 10_000, 0, 0, 1000, false},
		{"just over a tenth of the share above", 10_000, 0, 0, 1001, true},
		{"a tenth above the rate held", 10_000, 0, 500, 1500, false},
		{"over a tenth above the rate held", 10_000, 0, 500, 1501, true},
		{"a tenth above what was reported", 10_000, 500, 0, 1500, false},
		{"over a tenth above what was reported", 10_000, 500, 0, 1501, true},
		// The noise (3·√(200/0.5) = 60) is above a tenth of the share (10).
		{"exactly the noise above", 100, 140, 0, 200, false},
		{"just over the noise above", 100, 139, 0, 200, true},
		{"over the noise above the rate but not the report", 100, 140, 139, 200, false},
	} {
		l, read := reportedThenRead(k, now, c.static, c.reported, c.rate, c.d, now+5_000_000)
		if got, _ := l.Moved(epoch, []KeyRead{read}); got != c.want {
			t.Errorf("%s: demand %v against reported %v and rate %v (share %v): risen %v, want %v",
				c.name, c.d, c.reported, c.rate, c.static, got, c.want)
		}
	}
}

// TestRisenNoiseOverAtLeastAMillisecond: the noise of a demand reading is
// taken over half an epoch but never less than 1 ms, so with an epoch
// under 2 ms the bound is 3·√(d/0.001): 9000/s exactly at it, and a
// demand either side of it judged as such.
func TestRisenNoiseOverAtLeastAMillisecond(t *testing.T) {
	k := quota.Key{Tenant: "acme", Class: "write"}
	now := int64(1_700_000_000_000_000)
	for _, epoch := range []time.Duration{0, time.Millisecond} {
		for _, c := range []struct {
			d    float64
			want bool
		}{{6000, false}, {9000, false}, {12000, true}} {
			l := NewLeader()
			l.Report("ap", now, epoch, Epoch, []KeyRead{{Key: k, State: luascripts.State{NowUS: now}}})
			read := KeyRead{Key: k, State: luascripts.State{LeaseDemand: c.d, NowUS: now + 1000}}
			if got, _ := l.Moved(epoch, []KeyRead{read}); got != c.want {
				t.Errorf("epoch %v, demand %v from nothing: risen %v, want %v", epoch, c.d, got, c.want)
			}
		}
	}
}

// TestWatchesAtMost256Keys: the documented bound of the rise watch.
func TestWatchesAtMost256Keys(t *testing.T) {
	now := int64(1_700_000_000_000_000)
	reads := make([]KeyRead, 300)
	for i := range reads {
		reads[i] = KeyRead{Key: quota.Key{Tenant: fmt.Sprintf("t%04d", i), Class: "write"}, StaticRate: 10,
			State: luascripts.State{LeaseDemand: 10, NowUS: now}}
	}
	l := NewLeader()
	l.Report("ap", now, time.Second, Epoch, reads)
	if got := l.Watched(); len(got) != 256 || got[255] != reads[255].Key {
		t.Fatalf("watched %d keys, want the first 256", len(got))
	}
}

// TestRiseReportCarriesItsReading: a rise the leader sees soon after its
// epoch report (within half an epoch) starts a report whose window since
// that epoch report is short, and the allocator takes no demand reading
// from a window under half an epoch. The risen key's reading therefore
// goes out over one epoch, as a first sight's does, and the allocator
// decides on it; a key of the same report that did not rise keeps its
// window. Before, the allocator kept the old estimate until the region's
// next epoch report.
func TestRiseReportCarriesItsReading(t *testing.T) {
	cfg, err := config.Parse([]byte(`
regions: {ap: {weight: 1}, eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {std: {write: {rate: 1000/s, burst: 1000}}}
default_tier: std
`))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	hot := quota.Key{Tenant: "acme", Class: "write"}
	calm := quota.Key{Tenant: "globex", Class: "write"}
	epoch := time.Second
	now := int64(1_700_000_000_000_000)
	a, err := hierarchy.NewAllocator(hierarchy.Options{
		Regions: []hierarchy.Region{{Name: "ap", Weight: 1}, {Name: "eu", Weight: 1}, {Name: "us", Weight: 1}},
		Epoch:   epoch, Validity: 5 * epoch, DemandAlpha: 1,
	}, time.UnixMicro(now))
	if err != nil {
		t.Fatal(err)
	}
	reads := func(us int64, hotDemand float64) []KeyRead {
		at := func(k quota.Key, d float64) KeyRead {
			return KeyRead{Key: k, StaticRate: 1000.0 / 3,
				State: luascripts.State{Rate: 1000.0 / 3, Cap: 333, LeaseDemand: d, NowUS: us}}
		}
		return []KeyRead{at(hot, hotDemand), at(calm, 200)}
	}
	demand := func(k quota.Key) float64 {
		for _, kv := range a.View(time.UnixMicro(now + 300_000)).Keys {
			if kv.Key == k {
				return kv.Regions[0].Demand // ap
			}
		}
		t.Fatalf("%v not in the allocator's view", k)
		return 0
	}
	l := NewLeader()
	send := func(us int64, kind Kind, r []KeyRead) {
		t.Helper()
		req, _ := l.Report("ap", us, epoch, kind, r)
		rep, limits, err := DecodeReport(cfg, req, 10)
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		for i, kd := range rep.Keys {
			if err := a.SetLimit(kd.Key, limits[i]); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.Report(time.UnixMicro(us), rep); err != nil {
			t.Fatalf("report: %v", err)
		}
	}
	send(now-epoch.Microseconds(), Epoch, reads(now-epoch.Microseconds(), 200))
	send(now, Epoch, reads(now, 200))
	if got := demand(hot); got != 200 {
		t.Fatalf("demand after the epoch report %v, want 200", got)
	}
	rise := reads(now+200_000, 1000)
	if rose, _ := l.Moved(epoch, rise); !rose {
		t.Fatal("a rise from 200/s to 1000/s is no rise")
	}
	send(now+200_000, Nudged, rise)
	if got := demand(hot); got != 1000 {
		t.Errorf("demand after the rise report %v, want the risen reading 1000", got)
	}
	req, _ := l.Report("ap", now+250_000, epoch, Ack, reads(now+250_000, 1000))
	if w := req.GetKeys()[1].GetWindowMs(); w != 250 {
		t.Errorf("a key that did not rise reported over %d ms, want its 250 ms since the epoch report", w)
	}
	if w := req.GetKeys()[0].GetWindowMs(); w != 250 {
		t.Errorf("a key already reported at its risen demand went out over %d ms, want 250", w)
	}
}

// reportedThenRead is a leader whose epoch report at now (an epoch of one
// second) named k with lease demand reported, refilled at rate with a
// grant until expiryUS (0: none) and a static share of static, and a read
// of k 100 ms later at demand d.
func reportedThenRead(k quota.Key, now int64, static, reported, rate, d float64, expiryUS int64) (*Leader, KeyRead) {
	at := func(us int64, demand float64) KeyRead {
		return KeyRead{Key: k, StaticRate: static,
			State: luascripts.State{Rate: rate, Cap: rate, LeaseDemand: demand, GrantExpiryUS: expiryUS, NowUS: us}}
	}
	l := NewLeader()
	l.Report("ap", now, time.Second, Epoch, []KeyRead{at(now, reported)})
	return l, at(now+100_000, d)
}

// TestFellAtItsThresholds: a fall (Moved) needs a grant, and demand below
// both the grant's rate and the demand last reported by more than a tenth
// of the static share and by more than three standard deviations of a
// Poisson count over half an epoch at the lower of the two
// (3·√(top/(epoch/2))); exactly at either threshold is no fall. A steady
// key whose grant exceeds its demand does not fall: its demand is what it
// reported.
func TestFellAtItsThresholds(t *testing.T) {
	k := quota.Key{Tenant: "acme", Class: "write"}
	now := int64(1_700_000_000_000_000)
	const epoch = time.Second // half an epoch: 0.5 s
	for _, c := range []struct {
		name                      string
		static, reported, rate, d float64
		granted                   bool
		want                      bool
	}{
		// A tenth of the share (1000) is above the noise (3·√10000 = 300).
		{"exactly a tenth of the share below", 10_000, 5000, 5000, 4000, true, false},
		{"just over a tenth of the share below", 10_000, 5000, 5000, 3999, true, true},
		{"a tenth below what was reported, under the rate", 10_000, 3000, 5000, 2000, true, false},
		{"over a tenth below what was reported, under the rate", 10_000, 3000, 5000, 1999, true, true},
		{"a tenth below the rate, under what was reported", 10_000, 5000, 3000, 2000, true, false},
		{"over a tenth below the rate, under what was reported", 10_000, 5000, 3000, 1999, true, true},
		{"a grant above the demand, steady", 10_000, 2000, 5000, 2000, true, false},
		{"no grant: the static share is counted anyway", 10_000, 5000, 5000, 0, false, false},
		// The noise (3·√(200/0.5) = 60) is above a tenth of the share (10).
		{"exactly the noise below", 100, 200, 200, 140, true, false},
		{"just over the noise below", 100, 200, 200, 139.9, true, true},
	} {
		var exp int64
		if c.granted {
			exp = now + 5_000_000
		}
		l, read := reportedThenRead(k, now, c.static, c.reported, c.rate, c.d, exp)
		rose, fell := l.Moved(epoch, []KeyRead{read})
		if fell != c.want || rose {
			t.Errorf("%s: demand %v against reported %v and rate %v (share %v, granted %v): fell %v rose %v, want fell %v",
				c.name, c.d, c.reported, c.rate, c.static, c.granted, fell, rose, c.want)
		}
	}
}

// TestFallReportCarriesItsReading: a report between epochs carries a
// granted key's fall as a reading over one epoch (the allocator takes no
// reading from its window since the epoch report), as it does a rise; a
// key that moved neither way keeps its window, and the next report
// compares with the fall it carried.
func TestFallReportCarriesItsReading(t *testing.T) {
	k := quota.Key{Tenant: "acme", Class: "write"}
	now := int64(1_700_000_000_000_000)
	const epoch = time.Second
	st := func(at int64, d float64) luascripts.State {
		return luascripts.State{Rate: 550, Cap: 550, LeaseDemand: d, GrantExpiryUS: now + 5_000_000, NowUS: at}
	}
	l := NewLeader()
	l.Report("us", now, epoch, Epoch, []KeyRead{{Key: k, StaticRate: 333, State: st(now, 1050)}})
	at := now + 300_000
	read := KeyRead{Key: k, StaticRate: 333, State: st(at, 150)}
	if _, fell := l.Moved(epoch, []KeyRead{read}); !fell {
		t.Fatal("a fall from 1050 to 150 under a grant of 550 is no fall")
	}
	rep, _ := l.Report("us", at, epoch, Nudged, []KeyRead{read})
	kd := rep.GetKeys()[0]
	if kd.GetWindowMs() != epoch.Milliseconds() || kd.GetAdmitted() != 0 || kd.GetDemandRate() != 150 {
		t.Fatalf("the fall went out as window %d ms, admitted %v, rate %v; want one epoch at 150/s, no counts",
			kd.GetWindowMs(), kd.GetAdmitted(), kd.GetDemandRate())
	}
	if _, fell := l.Moved(epoch, []KeyRead{{Key: k, StaticRate: 333, State: st(at+100_000, 150)}}); fell {
		t.Fatal("the fall counts again after its report carried it")
	}
	steady := KeyRead{Key: k, StaticRate: 333, State: st(at+200_000, 160)}
	rep, _ = l.Report("us", at+200_000, epoch, Nudged, []KeyRead{steady})
	if kd := rep.GetKeys()[0]; kd.GetWindowMs() == epoch.Milliseconds() {
		t.Fatalf("a key that moved neither way went out as a reading over one epoch: %v", kd)
	}
}

// TestStrictDemandIsJudgedAtItsEpochRate: between epochs a strict key's
// demand is its decisions per second over the last epoch report's window
// (the strict path keeps counts, and a count over the milliseconds since
// that report is noise), plus its leases' rates. A key granted its steady
// 20/s read 125 ms after its epoch report (2 decisions) neither fell nor
// rose, and a report then carries its 2 decisions over their own 125 ms,
// which the allocator takes no reading from; judged on its leases alone
// (none) it always fell, and went out as a reading of 16/s over a whole
// epoch, which cut its grant. A fall of its leases still counts.
func TestStrictDemandIsJudgedAtItsEpochRate(t *testing.T) {
	k := quota.Key{Tenant: "z", Class: "pay"}
	now := int64(1_700_000_000_000_000)
	const epoch = time.Second
	rate := 20.0
	read := func(at int64, decisions int64, lease float64) KeyRead {
		return KeyRead{Key: k, StaticRate: 37.5, State: luascripts.State{Rate: rate, Cap: 4, GrantExpiryUS: now + 5_000_000,
			StrictDemand: decisions, LeaseDemand: lease, NowUS: at}}
	}
	l := NewLeader()
	l.Report("a", now-1_000_000, epoch, Epoch, []KeyRead{read(now-1_000_000, 100, 0)})
	rep, _ := l.Report("a", now, epoch, Epoch, []KeyRead{read(now, 120, 0)})
	if got := rep.GetKeys()[0].GetDemandRate(); got != 20 {
		t.Fatalf("the epoch report read %v/s, want the 20 decisions over its second", got)
	}
	later := read(now+125_000, 122, 0)
	if rose, fell := l.Moved(epoch, []KeyRead{later}); rose || fell {
		t.Fatalf("2 decisions 125 ms after a steady 20/s: rose %v fell %v, want neither", rose, fell)
	}
	rep, _ = l.Report("a", now+125_000, epoch, Nudged, []KeyRead{later})
	if kd := rep.GetKeys()[0]; kd.GetWindowMs() != 125 || kd.GetAdmitted()+kd.GetDenied() != 0 || kd.GetDemandRate() != 16 {
		t.Fatalf("the report between epochs went out as window %d ms, counts %d+%d, rate %v; want its own 125 ms (2 decisions, 16/s)",
			kd.GetWindowMs(), kd.GetAdmitted(), kd.GetDenied(), kd.GetDemandRate())
	}
	if _, fell := l.Moved(epoch, []KeyRead{read(now+250_000, 122, 0)}); fell {
		t.Fatal("no decision in the next 125 ms reads as a fall: the report's short window became the demand compared with")
	}
	// The same key granted 80/s, with leases asking 60/s on top, whose
	// leases stop.
	rate = 80
	l = NewLeader()
	l.Report("a", now-1_000_000, epoch, Epoch, []KeyRead{read(now-1_000_000, 100, 60)})
	l.Report("a", now, epoch, Epoch, []KeyRead{read(now, 120, 60)})
	fall := read(now+125_000, 122, 0)
	if _, fell := l.Moved(epoch, []KeyRead{fall}); !fell {
		t.Fatal("leases falling from 60/s to nothing beside 20/s of strict decisions is no fall")
	}
	rep, _ = l.Report("a", now+125_000, epoch, Nudged, []KeyRead{fall})
	if kd := rep.GetKeys()[0]; kd.GetWindowMs() != epoch.Milliseconds() || kd.GetDemandRate() != 20 {
		t.Fatalf("the fall went out as window %d ms at %v/s, want one epoch at the 20/s of strict decisions", kd.GetWindowMs(), kd.GetDemandRate())
	}
}
