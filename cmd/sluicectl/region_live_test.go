package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
)

// regionLiveConfig has short periods so a region's static lease lapses in
// about two seconds. The class keeps half its static share as its floor.
const regionLiveConfig = `
epoch: 100ms
grant_validity: 500ms
region_lease: 1s
lease_ttl: 500ms
refresh: 50ms
regions:
  us-east: {weight: 1}
  eu-west: {weight: 1}
classes:
  read: {mode: lease, on_failure: local, partition_share: 0.5}
tiers:
  free: {read: {rate: 100/s, burst: 100}}
default_tier: free
`

// TestRegionDrainRestoreAndLapseAgainstRealDaemons drives a real
// deployment (embedded etcd, a Redis and a regional service per region, a
// global allocator) through the CLI: drain and restore a region and watch
// status follow, then kill the region's only replica and watch status
// show it silent, then its static lease expired, then live again after a
// restart. Every deadline is a multiple of the config's own periods: the
// states are observed, not timed (the timing is the e2e tests' job).
func TestRegionDrainRestoreAndLapseAgainstRealDaemons(t *testing.T) {
	cfg, err := config.Parse([]byte(regionLiveConfig))
	if err != nil {
		t.Fatal(err)
	}
	c, err := devcluster.Start(context.Background(), devcluster.Options{Config: cfg, SessionTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	epoch, validity, lease := time.Duration(cfg.Epoch), time.Duration(cfg.GrantValidity), time.Duration(cfg.RegionLease)
	lapse := lease + validity + time.Duration(hierarchy.LapseMargin(epoch, lease))
	// Generous for a loaded machine: a stalled process misses epochs.
	settle := 100 * epoch
	flags := []string{"-etcd-endpoints", c.EtcdAddr(), "-global-addr", c.GlobalAddrs()[0]}
	cli := func(args ...string) result {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append(append([]string(nil), flags...), args...), strings.NewReader(""), &stdout, &stderr)
		return result{code, stdout.String(), stderr.String()}
	}
	// waitState polls status -o json until region is in state, and
	// returns that region's view and the text rendering of the same moment.
	waitState := func(region, state string, within time.Duration) (regionView, string) {
		t.Helper()
		deadline := time.Now().Add(within)
		var last result
		for {
			last = cli("status", "-o", "json")
			var rep statusReport
			if last.code == exitOK && json.Unmarshal([]byte(last.stdout), &rep) == nil && rep.Global != nil && rep.Global.AnsweredByLeader {
				for _, r := range rep.Global.Regions {
					if r.Region == region && r.State == state {
						var out bytes.Buffer
						if err := writeStatusText(&out, &rep); err != nil {
							t.Fatal(err)
						}
						return r, out.String()
					}
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not %s within %v; last status:\n%s", region, state, within, last)
			}
			time.Sleep(epoch / 2) // polling the deployment with a deadline
		}
	}

	for _, r := range []string{"us-east", "eu-west"} {
		v, _ := waitState(r, "live", settle)
		if v.ReservedFraction != 1 || v.StaticLeaseMs <= 0 {
			t.Fatalf("live %s: %+v, want all of its static share reserved and a static lease", r, v)
		}
	}

	// Drain: status shows it from the config at once, and from the
	// allocator once it loaded the revision.
	r := cli("region", "drain", "eu-west", "-yes")
	wantCode(t, r, exitOK)
	v, text := waitState("eu-west", "drained", settle)
	t.Logf("after the drain:\n%s", text)
	if v.ReservedFraction != 0.5 {
		t.Errorf("drained eu-west: reserved fraction %v, want the class's partition_share 0.5", v.ReservedFraction)
	}
	if !regexpLine(text, "eu-west", "drained in the config") {
		t.Errorf("the region table does not note the drain from the config:\n%s", text)
	}
	if !strings.Contains(text, "DRAINED") {
		t.Errorf("status text does not say DRAINED:\n%s", text)
	}
	wantCode(t, cli("region", "drain", "eu-west", "-yes"), exitOK)

	r = cli("region", "restore", "eu-west", "-yes")
	wantCode(t, r, exitOK)
	waitState("eu-west", "live", settle)

	// Region down: its only replica dies. Silent first, then its static
	// lease expires (no sooner than lease + validity + margin after its
	// last report).
	killed := time.Now()
	c.Regions["eu-west"].Replicas[0].Kill()
	t.Logf("killing eu-west's replica took %v", time.Since(killed))
	v, text = waitState("eu-west", "silent", settle)
	t.Logf("region down, silent:\n%s", text)
	if v.SilentSince == nil || !strings.Contains(text, "SILENT since") {
		t.Errorf("silent eu-west without a since: %+v\n%s", v, text)
	}
	v, text = waitState("eu-west", "lapsed", lapse+settle)
	t.Logf("region down, lapsed %v after the kill (lapse after %v of silence):\n%s", time.Since(killed), lapse, text)
	if v.ReservedFraction != 0.5 || v.StaticLeaseMs != 0 {
		t.Errorf("lapsed eu-west: %+v, want its floor (0.5) reserved and no static lease", v)
	}
	// eu-west reported before it died, so a global leader that never
	// heard from it began a new term since (a starved replica's etcd
	// session can expire and be won again): its allocator counts the
	// silence from its own start, and cannot say since when.
	if v.LastReportAgeMs < 0 {
		t.Logf("the global leader began a new term after eu-west's last report: the lapse counts from the term's start, not judged against the last report")
		if !strings.Contains(text, "LEASE EXPIRED (") {
			t.Errorf("status text does not say LEASE EXPIRED:\n%s", text)
		}
	} else {
		if !strings.Contains(text, "LEASE EXPIRED (silent since") {
			t.Errorf("status text does not say LEASE EXPIRED:\n%s", text)
		}
		// On the allocator's own clock: it declares the lapse only after
		// region_lease + grant_validity + margin without a report.
		if silent := time.Duration(v.LastReportAgeMs) * time.Millisecond; silent < lapse-time.Millisecond {
			t.Errorf("eu-west lapsed after %v without a report, before region_lease + grant_validity + margin = %v", silent, lapse)
		}
	}

	if err := c.Regions["eu-west"].Replicas[0].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Returning until its static lease is conferred again, then live.
	waitState("eu-west", "live", validity+settle)
}
