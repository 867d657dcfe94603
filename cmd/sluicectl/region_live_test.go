package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
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
	d := startRegionLive(t, regionLiveConfig)
	c, cli, epoch, validity, lapse, settle := d.c, d.cli, d.epoch, d.validity, d.lapse, d.settle
	waitState := func(region, state string, within time.Duration) (regionView, string) {
		t.Helper()
		return d.waitRegion(t, region, state, within, func(v regionView) bool { return v.State == state })
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
	// Until eu-west reports the draining revision the global tier still
	// reserves its share under the one it ran: the whole share.
	for deadline := time.Now().Add(settle); v.DrainPending; {
		if v.ReservedFraction != 1 {
			t.Errorf("drained eu-west before it adopted the drain: reserved fraction %v, want 1 (its share under the revision it runs)", v.ReservedFraction)
		}
		if time.Now().After(deadline) {
			t.Fatalf("eu-west did not adopt the drain within %v:\n%s", settle, text)
		}
		time.Sleep(epoch / 2) // polling the deployment with a deadline
		v, text = waitState("eu-west", "drained", settle)
	}
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

// drainDownConfig has two classes whose floors differ (partition_share 0
// and 0.25), so a region on its floor is reserved a different fraction per
// class.
const drainDownConfig = `
epoch: 100ms
grant_validity: 500ms
region_lease: 1s
lease_ttl: 500ms
refresh: 50ms
regions:
  us-east: {weight: 1}
  eu-west: {weight: 1}
  ap-south: {weight: 2}
classes:
  read: {mode: lease, on_failure: local, partition_share: 0}
  write: {mode: lease, on_failure: local, partition_share: 0.25}
tiers:
  free: {read: {rate: 100/s, burst: 100}, write: {rate: 100/s, burst: 100}}
default_tier: free
`

// TestDrainOfADeadRegionAgainstRealDaemons kills a region's only replica
// and drains it while it is silent, as an operator would during an outage:
// the drain says its share does not move sooner; status shows it drained
// and silent, its share still reserved whole (it cannot adopt the drain)
// until its static lease lapses, then drained and lapsed, reserved per
// class (0% for read, 25% for write).
func TestDrainOfADeadRegionAgainstRealDaemons(t *testing.T) {
	d := startRegionLive(t, drainDownConfig)
	c, cli, lapse, settle := d.c, d.cli, d.lapse, d.settle
	waitRegion := func(region, what string, within time.Duration, ok func(regionView) bool) (regionView, string) {
		t.Helper()
		return d.waitRegion(t, region, what, within, ok)
	}
	for _, r := range []string{"us-east", "eu-west", "ap-south"} {
		waitRegion(r, "live", settle, func(v regionView) bool { return v.State == "live" && v.StaticLeaseMs > 0 })
	}

	c.Regions["eu-west"].Replicas[0].Kill()
	waitRegion("eu-west", "silent", settle, func(v regionView) bool { return v.Silent })

	r := cli("region", "drain", "eu-west", "-yes")
	wantCode(t, r, exitOK)
	t.Logf("drain of a silent region:\n%s", r.stdout)
	// "silent since <time>" when the global leader heard eu-west before it
	// died; a leader elected since (a loaded machine misses a session's
	// keepalives) never heard it, and says "silent" alone.
	wantContains(t, "stdout", r.stdout, "eu-west is silent", "the drain does not move its share sooner",
		"region_lease + grant_validity + max(epoch, 1% of region_lease) = "+lapse.String())
	if strings.Contains(r.stdout, "as its grants expire") {
		t.Errorf("the drain of a silent region promises its share moves as its grants expire:\n%s", r.stdout)
	}

	// Drained in the config, but it never loads it: its whole share stays
	// reserved, and status says so and that it is silent.
	v, text := waitRegion("eu-west", "drained (pending)", settle, func(v regionView) bool { return v.State == "drained" && !v.Lapsed })
	t.Logf("drained while down:\n%s", text)
	if !v.DrainPending || !v.Silent || v.ReservedFraction != 1 || v.ReservedMinFraction != 1 {
		t.Errorf("drained silent eu-west: %+v, want drain pending, silent, its whole share reserved", v)
	}
	if !lineMatches(text, `^eu-west\s.*100%\s+DRAINED in the config, SILENT( since \S+)? \(has not adopted the drain`) {
		t.Errorf("status does not show eu-west drained, silent and reserved whole:\n%s", text)
	}

	// Lapsed: on its floor, which is per class.
	v, text = waitRegion("eu-west", "drained and lapsed", lapse+settle, func(v regionView) bool { return v.State == "drained" && v.Lapsed })
	t.Logf("drained and lapsed:\n%s", text)
	if v.DrainPending || v.ReservedFraction != 0.25 || v.ReservedMinFraction != 0 {
		t.Errorf("drained lapsed eu-west: %+v, want no drain pending, reserved 0 to 0.25", v)
	}
	if !lineMatches(text, `^eu-west\s.*0-25% by class\s+DRAINED, LEASE EXPIRED \(`) {
		t.Errorf("status does not show eu-west drained, lapsed and reserved by class:\n%s", text)
	}
	wantContains(t, "status text", text, "RESERVED on a floor is per class (its partition_share): read 0%, write 25%")
	if lineMatches(text, `^us-east\s.*by class`) {
		t.Errorf("a live region is shown reserved by class:\n%s", text)
	}
}

// lineMatches says whether a line of text matches the regular expression.
func lineMatches(text, expr string) bool {
	re := regexp.MustCompile(expr)
	for _, l := range strings.Split(text, "\n") {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

// regionLive is a deployment the region tests drive through the CLI, with
// the config's periods the tests' deadlines derive from.
type regionLive struct {
	c               *devcluster.Cluster
	cfg             *config.Config
	epoch, validity time.Duration
	lapse           time.Duration // region_lease + grant_validity + margin: a silent region's lapse
	settle          time.Duration // generous for a loaded machine: a stalled process misses epochs
	cli             func(args ...string) result
}

// startRegionLive starts a deployment (embedded etcd, a Redis and a
// regional service per region, a global allocator) on the config yaml.
func startRegionLive(t *testing.T, yaml string) *regionLive {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	c, err := devcluster.Start(context.Background(), devcluster.Options{Config: cfg, SessionTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	epoch, validity, lease := time.Duration(cfg.Epoch), time.Duration(cfg.GrantValidity), time.Duration(cfg.RegionLease)
	d := &regionLive{c: c, cfg: cfg, epoch: epoch, validity: validity,
		lapse:  lease + validity + time.Duration(hierarchy.LapseMargin(epoch, lease)),
		settle: 100 * epoch}
	flags := []string{"-etcd-endpoints", c.EtcdAddr(), "-global-addr", c.GlobalAddrs()[0]}
	d.cli = func(args ...string) result {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), append(append([]string(nil), flags...), args...), strings.NewReader(""), &stdout, &stderr)
		return result{code, stdout.String(), stderr.String()}
	}
	return d
}

// waitRegion polls status -o json until region's view satisfies ok, and
// returns it with the text rendering of the same moment.
func (d *regionLive) waitRegion(t *testing.T, region, what string, within time.Duration, ok func(regionView) bool) (regionView, string) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last result
	for {
		last = d.cli("status", "-o", "json")
		var rep statusReport
		if last.code == exitOK && json.Unmarshal([]byte(last.stdout), &rep) == nil && rep.Global != nil && rep.Global.AnsweredByLeader {
			for _, r := range rep.Global.Regions {
				if r.Region == region && ok(r) {
					var out bytes.Buffer
					if err := writeStatusText(&out, &rep); err != nil {
						t.Fatal(err)
					}
					return r, out.String()
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not %s within %v; last status:\n%s", region, what, within, last)
		}
		time.Sleep(d.epoch / 2) // polling the deployment with a deadline
	}
}

// TestRestoreWhileARegionIsDownAgainstRealDaemons restores a drained
// region while another region's only replica is dead: a raised static
// share waits until every region reported the restoring revision, so the
// restore says it waits for the silent region instead of promising a few
// epochs.
func TestRestoreWhileARegionIsDownAgainstRealDaemons(t *testing.T) {
	d := startRegionLive(t, drainDownConfig)
	c, cli, settle := d.c, d.cli, d.settle
	waitRegion := func(region, what string, within time.Duration, ok func(regionView) bool) (regionView, string) {
		t.Helper()
		return d.waitRegion(t, region, what, within, ok)
	}
	for _, r := range []string{"us-east", "eu-west", "ap-south"} {
		waitRegion(r, "live", settle, func(v regionView) bool { return v.State == "live" && v.StaticLeaseMs > 0 })
	}
	wantCode(t, cli("region", "drain", "us-east", "-yes"), exitOK)
	waitRegion("us-east", "drained", settle, func(v regionView) bool { return v.State == "drained" && !v.DrainPending })

	c.Regions["eu-west"].Replicas[0].Kill()
	waitRegion("eu-west", "silent", settle, func(v regionView) bool { return v.Silent })

	r := cli("region", "restore", "us-east", "-yes")
	wantCode(t, r, exitOK)
	t.Logf("restore while eu-west is down:\n%s", r.stdout)
	wantContains(t, "stdout", r.stdout, "the global tier hears no report from eu-west since",
		"us-east's static share rises only once every region has adopted this revision, so not before eu-west reports again")
	if strings.Contains(r.stdout, "at most a few epochs") {
		t.Errorf("a restore while a region is down promises the rise within a few epochs:\n%s", r.stdout)
	}
}
