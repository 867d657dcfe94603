package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/pkg/config"
)

// probeLiveConfig has a strict class whose bucket holds one token and
// refills once a second: checks in a row see both answers.
const probeLiveConfig = `
epoch: 100ms
grant_validity: 500ms
lease_ttl: 500ms
refresh: 50ms
regions:
  us-east: {weight: 1}
classes:
  read:   {mode: lease,  on_failure: local}
  export: {mode: strict, on_failure: closed}
tiers:
  free: {read: {rate: 100/s, burst: 100}, export: {rate: 1/s, burst: 1}}
default_tier: free
`

// TestLeaseOnStrictClassAndDeniedCheckAgainstARegion: lease on a strict
// class is refused with a pointer to check (non-zero exit), and a denied
// check exits with exitDenied while an allowed one exits 0.
func TestLeaseOnStrictClassAndDeniedCheckAgainstARegion(t *testing.T) {
	cfg, err := config.Parse([]byte(probeLiveConfig))
	if err != nil {
		t.Fatal(err)
	}
	c, err := devcluster.Start(context.Background(), devcluster.Options{Config: cfg, SessionTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	addr := c.RegionalAddrs("us-east")[0]

	r := sluicectl(t, "", "lease", "-addr", addr, "-tenant", "t1", "-class", "export")
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, `class "export" is strict`, "sluicectl check", "-class export")
	if strings.Contains(r.stdout, "granted") {
		t.Fatalf("lease on a strict class printed a grant:\n%s", r)
	}

	// Checks in a row: a cold bucket starts empty, then one token a
	// second. Every answer is allowed (exit 0) or denied (exitDenied); poll
	// until both were seen, bounded by many lease TTLs.
	deadline := time.Now().Add(100 * time.Duration(cfg.LeaseTTL))
	var allowed, denied bool
	for !allowed || !denied {
		r = sluicectl(t, "", "check", "-addr", addr, "-tenant", "t2", "-class", "export")
		switch r.code {
		case exitOK:
			allowed = true
			wantContains(t, "stdout", r.stdout, "allowed")
		case exitDenied:
			denied = true
			// A wait, or "no wait helps" while the region runs on its
			// floor before it first hears from the global tier.
			wantContains(t, "stdout", r.stdout, "denied (")
			if strings.Contains(r.stdout, "-1ms") {
				t.Fatalf("a denial printed the wire's -1 as a wait:\n%s", r)
			}
			if r.stderr != "" {
				t.Fatalf("a denial is a result, not an error, yet stderr has:\n%s", r)
			}
		default:
			t.Fatalf("check exited neither 0 nor %d: %s", exitDenied, r)
		}
		if time.Now().After(deadline) {
			t.Fatalf("saw allowed=%v denied=%v; last: %s", allowed, denied, r)
		}
		if allowed && !denied {
			continue // the next check in a row finds the bucket empty
		}
		time.Sleep(time.Duration(cfg.Refresh)) // polling the deployment with a deadline
	}
}

// TestCheckBeyondTheRegionsCapSaysNoWaitHelps: a check costing more than
// the region's bucket can hold (us-east's cap is 1 of a burst of 2 over
// two regions) is denied with the region's "never", which sluicectl says
// in words instead of printing the wire's -1 as a wait.
func TestCheckBeyondTheRegionsCapSaysNoWaitHelps(t *testing.T) {
	cfg, err := config.Parse([]byte(`
epoch: 100ms
grant_validity: 500ms
lease_ttl: 500ms
refresh: 50ms
regions: {us-east: {weight: 1}, eu-west: {weight: 1}}
classes: {export: {mode: strict, on_failure: closed}}
tiers: {free: {export: {rate: 1/s, burst: 2}}}
default_tier: free
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := devcluster.Start(context.Background(), devcluster.Options{Config: cfg, SessionTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	r := sluicectl(t, "", "check", "-addr", c.RegionalAddrs("us-east")[0], "-tenant", "t3", "-class", "export", "-cost", "2")
	wantCode(t, r, exitDenied)
	wantContains(t, "stdout", r.stdout, "no wait helps")
	if strings.Contains(r.stdout, "-1ms") {
		t.Fatalf("a denial no wait cures printed the wire's -1 as a wait:\n%s", r)
	}
}
