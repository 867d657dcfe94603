package regionsync

import (
	"math"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"

	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestReleasedTokensGoOutOnceWhileTheirGrantIsHeld: tokens an install
// clipped, and tokens a state read took (leases returned above the cap),
// are reported once, in the next report that finds the key still holding
// the grant they were clipped under; otherwise they are dropped
// (docs/architecture.md, "Burst transfer").
func TestReleasedTokensGoOutOnceWhileTheirGrantIsHeld(t *testing.T) {
	key := quota.Key{Tenant: "acme", Class: "write"}
	const now, expiry = 1_000_000, 6_000_000
	held := luascripts.State{Rate: 10, Cap: 10, GrantExpiryUS: expiry, NowUS: now}
	report := func(l *Leader, st luascripts.State) float64 {
		t.Helper()
		rep, _ := l.Report("eu", st.NowUS, time.Second, Ack, []KeyRead{{Key: key, State: st, StaticRate: 50}})
		return rep.GetKeys()[0].GetReleased()
	}
	install := func(l *Leader, rate, burst float64, exp int64, released float64) {
		l.Installed([]Install{{Key: key, Rate: rate, Burst: burst, ExpiryUS: exp, Released: released}}, []bool{true})
	}

	l := NewLeader()
	install(l, 10, 10, expiry, 40)
	st := held
	st.Released = 5 // taken by this read: leases gave back 5 above the cap
	if got := report(l, st); got != 45 {
		t.Fatalf("first report: released %v, want 45 (40 clipped by the install, 5 taken by the read)", got)
	}
	if got := report(l, held); got != 0 {
		t.Fatalf("second report: released %v, want 0 (sent once)", got)
	}

	// Another grant installed since: what the old one released is gone.
	install(l, 10, 10, expiry, 40)
	install(l, 20, 20, expiry+1000, 0)
	if got := report(l, luascripts.State{Rate: 20, Cap: 20, GrantExpiryUS: expiry + 1000, NowUS: now}); got != 0 {
		t.Fatalf("after another install: released %v, want 0", got)
	}

	// The grant ended before the report read the key: gone.
	install(l, 10, 10, expiry, 40)
	if got := report(l, luascripts.State{NowUS: expiry + 1}); got != 0 {
		t.Fatalf("after the grant ended: released %v, want 0", got)
	}

	// A new leadership knows nothing of its predecessor's.
	install(l, 10, 10, expiry, 40)
	l.Elected()
	if got := report(l, held); got != 0 {
		t.Fatalf("after an election: released %v, want 0", got)
	}

	// An install that clipped nothing keeps what a read took under the
	// same grant.
	l = NewLeader()
	st = held
	st.Released = 7
	l.Moved(time.Second, []KeyRead{{Key: key, State: st, StaticRate: 50}})
	install(l, 10, 10, expiry, 0)
	if got := report(l, held); got != 7 {
		t.Fatalf("taken between reports, the same grant re-installed: released %v, want 7", got)
	}
}

// TestInstallsRefuseABadDeposit: a grant whose deposit is negative, NaN
// or infinite is refused, like a bad rate or burst; a good one is passed
// on to set_rate.
func TestInstallsRefuseABadDeposit(t *testing.T) {
	for _, c := range []struct {
		deposit float64
		ok      bool
	}{{0, true}, {12.5, true}, {-1, false}, {math.NaN(), false}, {math.Inf(1), false}} {
		g := &sluicev1.RegionGrants{Grants: []*sluicev1.KeyGrant{{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}, Rate: 10, Burst: 20, ValidMs: 1000, Deposit: c.deposit}}}
		installs, refused := Installs(g, 1_000_000, Held{})
		if c.ok != (len(installs) == 1 && len(refused) == 0) {
			t.Fatalf("deposit %v: installs %+v refused %+v, want accepted %v", c.deposit, installs, refused, c.ok)
		}
		if c.ok && installs[0].Deposit != c.deposit {
			t.Fatalf("deposit %v passed on as %v", c.deposit, installs[0].Deposit)
		}
	}
}
