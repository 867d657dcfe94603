package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regional"
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

// TestCheckBeyondALeasedRegionsCapSaysAWaitHelps: a check costing more
// than the region's bucket holds now (us-east's cap is 1 of a burst of 2
// over two regions) is denied with the region's "never", which sluicectl
// says in words instead of printing the wire's -1 as a wait; the region
// has a global tier, which grants it more of the burst, so the words say
// a wait helps, as the lease client answers it (a retry after a refresh).
func TestCheckBeyondALeasedRegionsCapSaysAWaitHelps(t *testing.T) {
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
	// Until the region first hears from the global tier it runs on its
	// floor (partition_share 0 for a closed class): a rate of 0, which a
	// wait cures too. Poll until its static lease gives it its share,
	// bounded by many epochs.
	deadline := time.Now().Add(100 * time.Duration(cfg.Epoch))
	for {
		r := sluicectl(t, "", "check", "-addr", c.RegionalAddrs("us-east")[0], "-tenant", "t3", "-class", "export", "-cost", "2")
		wantCode(t, r, exitDenied)
		if strings.Contains(r.stdout, "-1ms") || strings.Contains(r.stdout, "no wait helps") {
			t.Fatalf("a denial a wait cures printed the wire's -1 as a wait, or no wait helps:\n%s", r)
		}
		if strings.Contains(r.stdout, "cannot hold 2 tokens now") {
			wantContains(t, "stdout", r.stdout, "cap for this key is 1,", "grants the region more", "asks again after a refresh")
			return
		}
		wantContains(t, "stdout", r.stdout, "rate for this key is 0", "asks again after a refresh")
		if time.Now().After(deadline) {
			t.Fatalf("the region ran on its floor throughout; last:\n%s", r)
		}
		time.Sleep(time.Duration(cfg.Epoch)) // polling the deployment with a deadline
	}
}

// TestRegionsNeverSaysWhetherAWaitHelps: lease and check print a region's
// "never" as the lease client decides it (pkg/lease, waitCures): "no wait
// helps" only from a region run with no global tier (-unleased), whose cap
// is its static share for good; a region with a global tier (here not
// reached, on its floor) below the cost, or at a rate of 0 on a floor of
// partition_share 0 (as drained, or a share awaiting confirmation), is
// given more without a config change, and the words say a client asks
// again. Before, both said "no wait helps while the region's cap stays as
// it is", and a drained region's, or a new class's, users were told to
// give up. (A real regional server and Redis.)
func TestRegionsNeverSaysWhetherAWaitHelps(t *testing.T) {
	for _, tc := range []struct {
		name, share string
		burst       int
		unleased    bool
		cmd         []string
		want        []string
		wantNoWait  bool
	}{
		{name: "unleased check above its cap", share: "1", burst: 5, unleased: true,
			cmd: []string{"check", "-class", "export", "-cost", "4"}, want: []string{"no global tier", "cap for this key (2)"}, wantNoWait: true},
		{name: "unleased lease below one token", share: "1", burst: 1, unleased: true,
			cmd: []string{"lease", "-class", "read"}, want: []string{"no global tier", "cannot hold 1 token"}, wantNoWait: true},
		{name: "leased check above its cap", share: "1", burst: 5,
			cmd: []string{"check", "-class", "export", "-cost", "4"}, want: []string{"cannot hold 4 tokens now", "cap for this key is 2,", "asks again after a refresh"}},
		{name: "leased check at a rate of 0", share: "0", burst: 5,
			cmd: []string{"check", "-class", "export"}, want: []string{"rate for this key is 0", "asks again after a refresh"}},
		{name: "leased lease at a rate of 0", share: "0", burst: 5,
			cmd: []string{"lease", "-class", "read"}, want: []string{"granted 0 of 10", "rate for this key is 0", "asks again after a refresh"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := regiontest.MustConfig(t, regiontest.TwoRegionsConfig(tc.share, tc.burst))
			reg := regiontest.Start(t, cfg, "local", func(o *regional.Options) { o.Unleased = tc.unleased })
			r := sluicectl(t, "", append(tc.cmd, "-addr", reg.Addr, "-tenant", "acme")...)
			if tc.cmd[0] == "check" {
				wantCode(t, r, exitDenied)
			} else {
				wantCode(t, r, exitOK)
			}
			wantContains(t, "stdout", r.stdout, tc.want...)
			if strings.Contains(r.stdout, "no wait helps") != tc.wantNoWait {
				t.Fatalf("want \"no wait helps\" %v:\n%s", tc.wantNoWait, r)
			}
			if strings.Contains(r.stdout, "-1ms") {
				t.Fatalf("printed the wire's -1 as a wait:\n%s", r)
			}
		})
	}
}

// TestLeasePrintsTheRegionsRateWithoutItsSafetyMargin: a region's static
// rate is rate·w/Σw shrunk by a relative 1e-12 so that the regions'
// shares never sum above the key's rate (pkg/config, staticShareScale),
// so the wire's region_rate for half of 5/s is 2.4999999999975; sluicectl
// lease prints it as the 2.5/s the config means. (A real regional server
// and Redis, run with no global tier so the rate is the static share.)
func TestLeasePrintsTheRegionsRateWithoutItsSafetyMargin(t *testing.T) {
	cfg := regiontest.MustConfig(t, regiontest.TwoRegionsConfig("1", 5))
	reg := regiontest.Start(t, cfg, "local", func(o *regional.Options) { o.Unleased = true })
	r := sluicectl(t, "", "lease", "-class", "read", "-addr", reg.Addr, "-tenant", "acme")
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "region refills at 2.5/s,")
	if strings.Contains(r.stdout, "2.49999") {
		t.Fatalf("printed the rate's safety margin as digits:\n%s", r)
	}
}
