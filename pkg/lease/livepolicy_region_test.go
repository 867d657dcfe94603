package lease_test

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestLivePolicyDecidesDegradedRequestsOverTheRegionsAnswer: a strict key
// the region answered (its class export fails closed) is cut off from the
// region; Options.Policies, the config the process holds now, decides its
// degraded requests from the next one on, in the order it changes: a
// class it names takes its on_failure and shadow, one it stops naming
// goes back to what the region said.
func TestLivePolicyDecidesDegradedRequestsOverTheRegionsAnswer(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	export := quota.Key{Tenant: "acme", Class: "export"}
	synctest.Test(t, func(t *testing.T) {
		var live atomic.Pointer[lease.ClassPolicy] // nil: the config names no such class
		c, _, _ := bubbleClient(t, conn, func(o *lease.Options) {
			o.Refresh = time.Hour
			o.Policies = func(class string) (lease.ClassPolicy, bool) {
				if p := live.Load(); p != nil && class == "export" {
					return *p, true
				}
				return lease.ClassPolicy{}, false
			}
		})
		if d := mustAllow(t, c, export, 1); d.Degraded || !d.Allowed {
			t.Fatalf("with the region up: %+v, want its admission", d)
		}
		conn.setFault("*", unreachable)
		for _, step := range []struct {
			name          string
			live          *lease.ClassPolicy
			allowed, deny bool // deny: WouldDeny
		}{
			{"the region's closed", nil, false, true},
			{"the config's open", &lease.ClassPolicy{Mode: lease.ModeStrict, OnFailure: lease.PolicyOpen}, true, false},
			{"the config's closed in shadow mode", &lease.ClassPolicy{Mode: lease.ModeStrict, OnFailure: lease.PolicyClosed, Shadow: true}, true, true},
			{"the config's closed", &lease.ClassPolicy{Mode: lease.ModeStrict, OnFailure: lease.PolicyClosed}, false, true},
			{"an unknown policy, ignored", &lease.ClassPolicy{Mode: lease.ModeStrict, OnFailure: lease.PolicyClosed + 1}, false, true},
			{"an unknown mode, ignored", &lease.ClassPolicy{Mode: lease.ModeStrict + 1, OnFailure: lease.PolicyOpen}, false, true},
			{"the config's open again", &lease.ClassPolicy{Mode: lease.ModeStrict, OnFailure: lease.PolicyOpen}, true, false},
			{"the region's closed again, the config naming no such class", nil, false, true},
		} {
			live.Store(step.live)
			d := mustAllow(t, c, export, 1)
			if !d.Degraded || d.Allowed != step.allowed || d.WouldDeny != step.deny {
				t.Errorf("%s: %+v, want degraded, allowed %v, would deny %v", step.name, d, step.allowed, step.deny)
			}
		}
		conn.setFault("*", healthy)
		closeClient(t, c)
	})
}

// TestNeverAnsweredKeyWithPoliciesRunsAtTheFallbackLimit: Policies give a
// class's on_failure policy but no limit and no instance count, so without
// StaticShare a key the region never answered this instance for (it
// started during the outage) is decided by its local policy at
// FallbackLimit per instance, as docs/operations.md ("Regional Redis
// down") states, whatever the key's configured rate (here 1/s, burst 100).
// pkg/agent's TestNeverAnsweredKeyRunsWithinTheRegionsStaticShare shows
// the bound StaticShare adds.
func TestNeverAnsweredKeyWithPoliciesRunsAtTheFallbackLimit(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		fallback := quota.Limit{Rate: 4, Burst: 4}
		c, _, _ := bubbleClient(t, conn, func(o *lease.Options) {
			o.Refresh = time.Hour
			o.FallbackLimit = fallback
			o.Policies = func(class string) (lease.ClassPolicy, bool) {
				return lease.ClassPolicy{Mode: lease.ModeLease, OnFailure: lease.PolicyLocal}, class == "read"
			}
		})
		conn.setFault("*", unreachable)
		admitted := 0
		for range 20 {
			d := mustAllow(t, c, acmeRead, 1)
			if !d.Degraded || d.Limit != fallback.Burst {
				t.Fatalf("never-answered key, region unreachable: %+v, want degraded at the fallback limit", d)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != int(fallback.Burst) {
			t.Fatalf("admitted %d of 20 at once, want the fallback burst %d", admitted, fallback.Burst)
		}
		conn.setFault("*", healthy)
		closeClient(t, c)
	})
}
