package lease_test

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// A region whose answers match the reports sent leaves no warning of
// grants that do not match: the request path logs one only for a step
// that failed to apply its answer, not on every step of a slow request.
func TestMatchingAnswersLogNoGrantMismatch(t *testing.T) {
	e := startRegion(t)
	c, _, logs := newClient(t, e)
	mustAllow(t, c, acmeRead, 1)                                   // a synchronous Acquire
	mustAllow(t, c, quota.Key{Tenant: "acme", Class: "export"}, 1) // a strict Check
	closeClient(t, c)
	if n := logs.Count("do not match"); n != 0 {
		t.Fatalf("%d warnings of mismatched grants from a region answering every call:\n%s", n, logs)
	}
}

// The end of degraded mode is logged once per episode, when the region
// answers again: not at each refresh of a client that was never degraded,
// nor again at the refreshes after the end. Its entry names the cause.
func TestDegradedModeEndIsLoggedOncePerEpisode(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, logs := bubbleClient(t, conn)
		mustAllow(t, c, acmeRead, 1)
		time.Sleep(3 * time.Second) // three periodic Syncs, each answered
		synctest.Wait()
		if n := logs.Count(degradedOver); n != 0 {
			t.Fatalf("%d ends of degraded mode logged by a client never degraded:\n%s", n, logs)
		}
		other := quota.Key{Tenant: "other", Class: "read"}
		conn.setFault("*", unreachable)
		if d := mustAllow(t, c, other, 1); !d.Degraded {
			t.Fatalf("request with the region unreachable: %+v, want degraded", d)
		}
		// The entry names its cause: the failed call's error.
		if !strings.Contains(logs.String(), "injected: region unreachable") {
			t.Fatalf("the entry into degraded mode logged without its cause:\n%s", logs)
		}
		conn.setFault("*", healthy)
		if d := mustAllow(t, c, other, 1); d.Degraded || !d.Allowed {
			t.Fatalf("request with the region back: %+v, want a leased allow", d)
		}
		time.Sleep(3 * time.Second) // three more periodic Syncs
		synctest.Wait()
		if n := logs.Count(degradedOver); n != 1 {
			t.Fatalf("%d ends of degraded mode logged for one episode, want 1:\n%s", n, logs)
		}
		closeClient(t, c)
	})
}

// A process that took a new instance id after a conflict keeps it: the
// conflict is handled once, not again at every wake of its owner loop.
func TestNewInstanceIDIsTakenOncePerConflict(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		a, _, logsA := bubbleClient(t, conn)
		b, _, logsB := bubbleClient(t, conn)
		shared := a.InstanceID()
		for range 3 {
			mustAllow(t, a, acmeRead, 1)
			mustAllow(t, b, acmeRead, 1)
			synctest.Wait()
			time.Sleep(time.Second) // one periodic Sync each
			synctest.Wait()
		}
		if a.InstanceID() == shared && b.InstanceID() == shared {
			t.Fatalf("both processes still report as %q after 3 refreshes of conflicting reports", shared)
		}
		ids := []string{a.InstanceID(), b.InstanceID()}
		for range 3 {
			mustAllow(t, a, acmeRead, 1)
			mustAllow(t, b, acmeRead, 1)
			synctest.Wait()
			time.Sleep(time.Second)
			synctest.Wait()
		}
		if got := []string{a.InstanceID(), b.InstanceID()}; got[0] != ids[0] || got[1] != ids[1] {
			t.Fatalf("ids %q three refreshes after %q, with no conflict since", got, ids)
		}
		for i, logs := range []*logtest.Buffer{logsA, logsB} {
			renamed := 0
			if ids[i] != shared {
				renamed = 1
			}
			if n := logs.Count("new instance id"); n != renamed {
				t.Fatalf("process %d logged %d new ids, took %d:\n%s", i, n, renamed, logs)
			}
		}
		closeClient(t, a)
		closeClient(t, b)
	})
}

// twoClasses and keptOnly: a config with classes read and kept, and the
// one that follows it without read.
const (
	twoClasses = `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}}
classes: {read: {mode: lease}, kept: {mode: lease}}
tiers: {free: {read: {rate: 1/s, burst: 100}, kept: {rate: 1/s, burst: 100}}}
default_tier: free
`
	keptOnly = `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}}
classes: {kept: {mode: lease}}
tiers: {free: {kept: {rate: 1/s, burst: 100}}}
default_tier: free
`
)

// A key the region refuses in a periodic Sync (its class left the
// config) is forgotten and named in a warning, as Options.Logger says:
// sent alone, or found among others by sending their batch in parts.
func TestKeyRefusedInASyncIsLoggedAndForgotten(t *testing.T) {
	var src regiontest.SwappedConfig
	src.Store(regiontest.MustConfig(t, twoClasses))
	reg := regiontest.Start(t, src.Current(), "local", func(o *regional.Options) { o.Config = &src })
	e := env{reg: reg, cfg: src.Current()}
	alone, aloneMetrics, aloneLogs := newClient(t, e, func(o *lease.Options) { o.InstanceID = "alone" })
	both, bothMetrics, bothLogs := newClient(t, e, func(o *lease.Options) { o.InstanceID = "both" })
	kept := quota.Key{Tenant: "acme", Class: "kept"}
	mustAllow(t, alone, acmeRead, 1)
	mustAllow(t, both, acmeRead, 1)
	mustAllow(t, both, kept, 1)
	src.Store(regiontest.MustConfig(t, keptOnly))
	const line = "region refused a key; forgetting it"
	// The refused Sync is one of the client's Syncs: the deadline's clock.
	// The key leaves the table before the warning is written (the Sync's
	// end forgets it, then the caller logs), so both are waited for.
	waitForSyncs(t, "the key refused alone forgotten", aloneMetrics, 20, func() bool {
		_, ok := alone.Cap(acmeRead)
		return !ok && aloneLogs.Count(line) > 0
	})
	if s := aloneLogs.String(); strings.Count(s, line) != 1 || !strings.Contains(s, "key="+acmeRead.String()) {
		t.Fatalf("want one warning naming the refused key:\n%s", s)
	}
	// Demand on kept keeps the periodic Syncs going.
	waitForSyncs(t, "the key refused beside another forgotten", bothMetrics, 20, func() bool {
		mustAllow(t, both, kept, 1)
		_, ok := both.Cap(acmeRead)
		return !ok && bothLogs.Count(line) > 0
	})
	if s := bothLogs.String(); !strings.Contains(s, "key="+acmeRead.String()) || strings.Contains(s, "key="+kept.String()) {
		t.Fatalf("want the refused key named and the kept one not:\n%s", s)
	}
	if _, ok := both.Cap(kept); !ok {
		t.Fatalf("the key the region still knows was forgotten")
	}
}
