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
