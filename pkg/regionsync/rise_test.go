package regionsync

import (
	"testing"
	"time"

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
		if got := l.Risen(epoch, []KeyRead{tc.read}); got != tc.want {
			t.Errorf("%s: risen %v, want %v", tc.name, got, tc.want)
		}
	}
	// A new leadership watches nothing until it reports.
	l.Elected()
	if len(l.Watched()) != 0 {
		t.Fatal("a new leadership watches keys it never reported")
	}
}

// TestOpenWindowsReportTheCounts: a key whose leases have no demand reading
// yet (LeaseDemand 0) but whose counters moved reports the counts' rate,
// not zero; a key with readings reports its leases' rates.
func TestOpenWindowsReportTheCounts(t *testing.T) {
	k := quota.Key{Tenant: "acme", Class: "write"}
	l := NewLeader()
	now := int64(1_700_000_000_000_000)
	at := func(us int64, adm int64, lease float64) []KeyRead {
		return []KeyRead{{Key: k, StaticRate: 333, State: luascripts.State{Admitted: adm, LeaseDemand: lease, NowUS: us, Rate: 333, Cap: 333}}}
	}
	l.Report("eu", now, time.Second, Epoch, at(now, 0, 0))
	rep, _ := l.Report("eu", now+1_000_000, time.Second, Epoch, at(now+1_000_000, 300, 0))
	if got := rep.Keys[0].GetDemandRate(); got != 300 {
		t.Fatalf("open windows, 300 admitted in 1s: demand %v, want 300", got)
	}
	rep, _ = l.Report("eu", now+2_000_000, time.Second, Epoch, at(now+2_000_000, 600, 280))
	if got := rep.Keys[0].GetDemandRate(); got != 280 {
		t.Fatalf("with a reading: demand %v, want the leases' 280", got)
	}
}
