package regionsync

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestSelectUnitesCandidatesAndSelected: the keys to read are the
// candidates and the keys selected before, each once, in key order.
func TestSelectUnitesCandidatesAndSelected(t *testing.T) {
	l := NewLeader()
	keyC := quota.Key{Tenant: "acme", Class: "write"}
	if got := l.Select([]quota.Key{keyB, keyA, keyB}); !slices.Equal(got, []quota.Key{keyA, keyB}) {
		t.Fatalf("Select = %v", got)
	}
	l.Report("eu", 1_000_000, time.Second, Epoch, []KeyRead{
		{Key: keyB, StaticRate: 10, State: luascripts.State{LeaseDemand: 9, NowUS: 1_000_000}},
	})
	if got := l.Select([]quota.Key{keyC}); !slices.Equal(got, []quota.Key{keyC, keyB}) {
		t.Fatalf("Select = %v, want %v and %v", got, keyC, keyB)
	}
	if got := l.Select(nil); !slices.Equal(got, []quota.Key{keyB}) {
		t.Fatalf("Select(nil) = %v, want the selected %v", got, keyB)
	}
	l.Elected()
	if got := l.Select(nil); len(got) != 0 {
		t.Fatalf("a new leadership selects %v before reading candidates", got)
	}
}

// TestSelectedKeyLeavesAfterLowEpochs: a reported key stays while its
// demand is at least LowShare of its static share, and leaves after
// LowEpochs epoch reports in a row below it; acknowledgements and
// catch-ups do not count towards leaving.
func TestSelectedKeyLeavesAfterLowEpochs(t *testing.T) {
	l := NewLeader()
	now := int64(1_000_000)
	report := func(kind Kind, demand float64) {
		t.Helper()
		now += 1_000_000
		rep, _ := l.Report("eu", now, time.Second, kind, []KeyRead{
			{Key: keyA, StaticRate: 100, State: luascripts.State{LeaseDemand: demand, NowUS: now}},
		})
		if len(rep.GetKeys()) != 1 {
			t.Fatalf("report %v", rep)
		}
	}
	report(Epoch, 80)
	report(Epoch, 30) // 30 ≥ 25: still needed
	for i := range LowEpochs - 1 {
		report(Epoch, 20)
		report(Ack, 0)
		report(CatchUp, 0)
		if l.Selected() != 1 {
			t.Fatalf("left after %d low epochs, want %d", i+1, LowEpochs)
		}
	}
	report(Epoch, 30) // back above: the count starts again
	for range LowEpochs - 1 {
		report(Epoch, 0)
	}
	if l.Selected() != 1 {
		t.Fatal("the low count did not restart when demand came back")
	}
	report(Epoch, 0)
	if l.Selected() != 0 {
		t.Fatalf("still selected after %d low epochs", LowEpochs)
	}
}

// TestGrantedKeyStaysSelected: an idle key reported while it holds a valid
// grant stays in the reports until the grant ends, then leaves after
// LowEpochs epochs; a key granted without being reported (Installed) is
// selected with an acknowledgement owed, which its next report pays.
func TestGrantedKeyStaysSelected(t *testing.T) {
	l := NewLeader()
	now := int64(1_000_000)
	expiry := now + 10_000_000
	for i := range 8 {
		now += 1_000_000
		ge := expiry
		if now >= expiry {
			ge = 0
		}
		l.Report("eu", now, time.Second, Epoch, []KeyRead{{Key: keyA, StaticRate: 100, State: luascripts.State{GrantExpiryUS: ge, NowUS: now}}})
		if l.Selected() != 1 {
			t.Fatalf("a granted idle key left the reports at report %d", i)
		}
	}
	l = NewLeader()
	l.Installed([]Install{{Key: keyA}, {Key: keyB}}, []bool{true, false})
	if got := l.Select(nil); !slices.Equal(got, []quota.Key{keyA}) {
		t.Fatalf("Select after an install = %v, want %v (applied) only", got, keyA)
	}
	// Reported with no demand and no grant (a grant below nothing: rate
	// 0 that expired): the acknowledgement holds it for that report only.
	for i := range 1 + LowEpochs {
		now += 1_000_000
		l.Report("eu", now, time.Second, Epoch, []KeyRead{{Key: keyA, StaticRate: 100, State: luascripts.State{NowUS: now}}})
		if i == 0 && l.Selected() != 1 {
			t.Fatal("the report paying the acknowledgement dropped the key")
		}
	}
	if l.Selected() != 0 {
		t.Fatalf("still selected %d low epochs after the acknowledgement", LowEpochs)
	}
}

// TestKeyOnAZeroShareLeaves: on its floor a region's share of a key may
// be 0; a key with no demand still leaves after LowEpochs.
func TestKeyOnAZeroShareLeaves(t *testing.T) {
	l := NewLeader()
	for i := range LowEpochs {
		now := int64(i+1) * 1_000_000
		l.Report("eu", now, time.Second, Epoch, []KeyRead{{Key: keyA, StaticRate: 0, State: luascripts.State{NowUS: now}}})
	}
	if l.Selected() != 0 {
		t.Fatal("a key with no demand on a zero share stays selected")
	}
}

// TestSelectedKeyNotReadLeaves: a selected key an epoch report did not
// read (its class left the config) is forgotten.
func TestSelectedKeyNotReadLeaves(t *testing.T) {
	l := NewLeader()
	l.Report("eu", 1_000_000, time.Second, Epoch, []KeyRead{
		{Key: keyA, StaticRate: 10, State: luascripts.State{LeaseDemand: 9, NowUS: 1_000_000}},
		{Key: keyB, StaticRate: 10, State: luascripts.State{LeaseDemand: 9, NowUS: 1_000_000}},
	})
	l.Report("eu", 2_000_000, time.Second, Ack, []KeyRead{{Key: keyA, StaticRate: 10, State: luascripts.State{LeaseDemand: 9, NowUS: 2_000_000}}})
	if l.Selected() != 2 {
		t.Fatal("an acknowledgement forgot a key it did not carry")
	}
	l.Report("eu", 3_000_000, time.Second, Epoch, []KeyRead{{Key: keyA, StaticRate: 10, State: luascripts.State{LeaseDemand: 9, NowUS: 3_000_000}}})
	if got := l.Select(nil); !slices.Equal(got, []quota.Key{keyA}) {
		t.Fatalf("selected %v, want %v", got, keyA)
	}
}

// TestCandidateTimes: the horizon and the mark interval follow the epoch.
func TestCandidateTimes(t *testing.T) {
	if got := CandidatesSince(10_000_000, time.Second); got != 8_000_000 {
		t.Fatalf("CandidatesSince = %d", got)
	}
	if got := MarkEvery(time.Second); got != 250*time.Millisecond {
		t.Fatalf("MarkEvery(1s) = %v", got)
	}
	if got := MarkEvery(time.Millisecond); got != time.Millisecond {
		t.Fatalf("MarkEvery(1ms) = %v", got)
	}
}

// TestSelectionAtTheLowShare: demand of exactly LowShare of the static
// share keeps a key selected, a hair below it does not, and any demand
// counts on a share below one token per second (only no demand at all is
// low there); a valid grant keeps an idle key whatever its share.
func TestSelectionAtTheLowShare(t *testing.T) {
	for _, c := range []struct {
		name           string
		static, demand float64
		granted        bool
		stays          bool
	}{
		{"exactly a quarter", 100, 25, false, true},
		{"a hair below a quarter", 100, math.Nextafter(25, 0), false, false},
		{"half a token on a share of one", 1, 0.5, false, true},
		{"a thousandth of a token on a share of a thousandth", 0.001, 0.001, false, true},
		{"an idle granted key on a share of 0", 0, 0, true, true},
	} {
		l := NewLeader()
		now := int64(1_000_000)
		for range LowEpochs {
			now += 1_000_000
			st := luascripts.State{LeaseDemand: c.demand, NowUS: now}
			if c.granted {
				st.GrantExpiryUS = now + 1
			}
			l.Report("eu", now, time.Second, Epoch, []KeyRead{{Key: keyA, StaticRate: c.static, State: st}})
		}
		if got := l.Selected() == 1; got != c.stays {
			t.Errorf("%s: selected after %d epoch reports %v, want %v", c.name, LowEpochs, got, c.stays)
		}
	}
}

// TestSelectOrdersByTenantThenClass: the keys to read come in tenant
// order, class breaking ties only between equal tenants, whatever order
// the candidates and the selected keys came in.
func TestSelectOrdersByTenantThenClass(t *testing.T) {
	want := []quota.Key{
		{Tenant: "acme", Class: "read"}, {Tenant: "acme", Class: "write"},
		{Tenant: "beta", Class: "alpha"}, {Tenant: "beta", Class: "read"}, {Tenant: "gamma", Class: "a"},
	}
	for rot := range want {
		cands := append(slices.Clone(want[rot:]), want[:rot]...)
		rev := slices.Clone(cands)
		slices.Reverse(rev)
		for _, in := range [][]quota.Key{cands, rev} {
			if got := NewLeader().Select(in); !slices.Equal(got, want) {
				t.Errorf("Select(%v) = %v, want %v", in, got, want)
			}
		}
	}
	// Selected before (reported) and new candidates mix in the same order.
	l := NewLeader()
	l.Report("eu", 1_000_000, time.Second, Epoch, []KeyRead{
		{Key: want[1], StaticRate: 10, State: luascripts.State{LeaseDemand: 9, NowUS: 1_000_000}},
		{Key: want[4], StaticRate: 10, State: luascripts.State{LeaseDemand: 9, NowUS: 1_000_000}},
	})
	if got := l.Select([]quota.Key{want[3], want[0], want[2], want[1]}); !slices.Equal(got, want) {
		t.Errorf("Select with %v selected = %v, want %v", []quota.Key{want[1], want[4]}, got, want)
	}
}

// TestIdleKeyLeavesAtTheThirdLowEpoch: the documented hysteresis in
// numbers: an idle key is still reported after two low epoch reports in a
// row and leaves with the third.
func TestIdleKeyLeavesAtTheThirdLowEpoch(t *testing.T) {
	l := NewLeader()
	for i, stays := range []bool{true, true, false} {
		now := int64(i+1) * 1_000_000
		l.Report("eu", now, time.Second, Epoch, []KeyRead{{Key: keyA, StaticRate: 100, State: luascripts.State{NowUS: now}}})
		if got := l.Selected() == 1; got != stays {
			t.Fatalf("after %d low epoch reports: selected %v, want %v", i+1, got, stays)
		}
	}
}
