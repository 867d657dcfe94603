package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
)

// drainedRegions is the set of drained regions in the config in etcd.
func (c *cluster) drainedRegions(t *testing.T) map[string]bool {
	t.Helper()
	cfg, _ := c.config(t)
	out := map[string]bool{}
	for name, r := range cfg.Regions {
		if r.Drained {
			out[name] = true
		}
	}
	return out
}

// wantUnwritten checks that etcd did not move from before.
func (c *cluster) wantUnwritten(t *testing.T, before int64, what string) {
	t.Helper()
	if after := c.revision(t); after != before {
		t.Fatalf("%s moved etcd from revision %d to %d", what, before, after)
	}
}

func TestRegionDrainAndRestoreWriteThroughTheDiff(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)

	// The diff comes first, and -dry-run stops there.
	before := c.revision(t)
	r := sluicectl(t, "", c.args("region", "drain", "eu-west", "-dry-run")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "--- current", "+++ proposed", "   eu-west:", "+    drained: true")
	wantContains(t, "stderr", r.stderr, "dry run: nothing written")
	c.wantUnwritten(t, before, "region drain -dry-run")

	// Without -yes and no terminal it refuses, as apply does.
	r = sluicectl(t, "", c.args("region", "drain", "eu-west")...)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "yes to write without asking")
	c.wantUnwritten(t, before, "an unconfirmed region drain")

	r = sluicectl(t, "", c.args("region", "drain", "eu-west", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "drained: true", "applied: revision", "eu-west runs on its floor", "grant_validity + 2 × epoch")
	if got := c.drainedRegions(t); len(got) != 1 || !got["eu-west"] {
		t.Fatalf("drained after drain = %v, want eu-west only", got)
	}

	// Draining again is a no-op that says so and succeeds.
	before = c.revision(t)
	r = sluicectl(t, "", c.args("region", "drain", "eu-west", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "region eu-west is already drained; nothing to write")
	if strings.Contains(r.stdout, "proposed") || strings.Contains(r.stdout, "applied") {
		t.Fatalf("a repeated drain showed a diff or wrote:\n%s", r)
	}
	c.wantUnwritten(t, before, "a repeated drain")

	// Restore clears the field (the diff shows the line going away).
	r = sluicectl(t, "", c.args("region", "restore", "eu-west", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "-    drained: true", "applied: revision", "grants bring eu-west's share back", "its static share rises once every region has reported")
	if got := c.drainedRegions(t); len(got) != 0 {
		t.Fatalf("drained after restore = %v, want none", got)
	}
	before = c.revision(t)
	r = sluicectl(t, "", c.args("region", "restore", "eu-west", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "region eu-west is not drained; nothing to write")
	c.wantUnwritten(t, before, "restoring a region that is not drained")
}

func TestRegionDrainRefusesUnknownAndLastServingRegion(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	before := c.revision(t)

	for _, verb := range []string{"drain", "restore"} {
		r := sluicectl(t, "", c.args("region", verb, "mars", "-yes")...)
		wantCode(t, r, exitNotFound)
		wantContains(t, "stderr", r.stderr, `region "mars" is not configured`, "ap-south, eu-west, us-east", "nothing was written")
	}
	c.wantUnwritten(t, before, "draining or restoring an unknown region")

	for _, name := range []string{"us-east", "eu-west"} {
		wantCode(t, sluicectl(t, "", c.args("region", "drain", name, "-yes")...), exitOK)
	}
	before = c.revision(t)
	r := sluicectl(t, "", c.args("region", "drain", "ap-south", "-yes")...)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "cannot drain ap-south: it is the last region not drained", "restore another region first", "nothing was written")
	c.wantUnwritten(t, before, "draining the last serving region")
	if got := c.drainedRegions(t); len(got) != 2 || got["ap-south"] {
		t.Fatalf("drained = %v, want us-east and eu-west", got)
	}

	// Usage errors: no region, two regions, a bare "region".
	for _, args := range [][]string{{"region", "drain"}, {"region", "restore", "eu-west", "us-east"}, {"region"}} {
		wantCode(t, sluicectl(t, "", c.args(args...)...), exitUsage)
	}
	c.wantUnwritten(t, before, "usage errors")

	// Help of the new subcommands is not an error.
	for _, verb := range []string{"drain", "restore"} {
		r := sluicectl(t, "", "region", verb, "-h")
		wantCode(t, r, exitOK)
		wantContains(t, "stderr", r.stderr, "usage: sluicectl region "+verb+" NAME", "-dry-run", "-yes")
		r = sluicectl(t, "", "region", verb, "--help")
		wantCode(t, r, exitOK)
	}
	wantContains(t, "usage", sluicectl(t, "", "-h").stderr, "region drain NAME", "region restore NAME")
	r = sluicectl(t, "", "region", "-h")
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "region drain NAME", "region restore NAME")
}

// TestRegionDrainLosingARaceIsAConflict: the drain is written in the same
// revision-guarded transaction as apply: a change that lands between the
// read and the write wins, and the drain writes nothing.
func TestRegionDrainLosingARaceIsAConflict(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	current, readRev := c.config(t)
	theirs, err := cloneConfig(current)
	if err != nil {
		t.Fatal(err)
	}
	theirs.DefaultTier = "pro"
	var theirRev int64
	a := &app{beforeWrite: func() {
		if theirRev, err = c.store.Apply(context.Background(), theirs, readRev); err != nil {
			t.Errorf("concurrent apply: %v", err)
		}
	}}
	r := runApp(t, a, c.args("region", "drain", "eu-west", "-yes")...)
	wantCode(t, r, exitConflict)
	wantContains(t, "stderr", r.stderr, "changed after it was read", "nothing was written")
	stored, rev := c.config(t)
	if rev != theirRev || stored.DefaultTier != "pro" || stored.Regions["eu-west"].Drained {
		t.Fatalf("etcd holds revision %d (theirs %d), default_tier %q, eu-west drained %t: the losing drain landed",
			rev, theirRev, stored.DefaultTier, stored.Regions["eu-west"].Drained)
	}
}

func TestRegionDrainWithoutConfigIsNotFound(t *testing.T) {
	c := newCluster(t)
	r := sluicectl(t, "", c.args("region", "drain", "eu-west", "-yes")...)
	wantCode(t, r, exitNotFound)
	wantContains(t, "stderr", r.stderr, "no config in etcd")
}

// TestApplyRefusesRemovingARegionNotDrained: a region removed from the
// config while it may still serve traffic would refuse every request
// once its replicas adopt the config, and its share would be re-divided
// at once; apply refuses, naming the region and the way (drain first),
// and writes nothing. Once it is drained the same removal applies.
func TestApplyRefusesRemovingARegionNotDrained(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	without, err := config.Parse(config.SampleYAML())
	if err != nil {
		t.Fatal(err)
	}
	delete(without.Regions, "eu-west")
	data, err := without.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	noEU := writeFile(t, "no-eu-west.yaml", string(data))

	before := c.revision(t)
	r := sluicectl(t, "", c.args("apply", "-f", noEU, "-yes")...)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "regions.eu-west: removed while not drained", "sluicectl region drain eu-west", "nothing was written")
	c.wantUnwritten(t, before, "an apply removing a region not drained")

	wantCode(t, sluicectl(t, "", c.args("region", "drain", "eu-west", "-yes")...), exitOK)
	r = sluicectl(t, "", c.args("apply", "-f", noEU, "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "-  eu-west:", "applied: revision")
	if stored, _ := c.config(t); stored == nil || len(stored.Regions) != 2 || stored.Regions["eu-west"] != (config.Region{}) {
		t.Fatalf("etcd holds regions %v after removing a drained eu-west", stored.Regions)
	}
}

// TestRestoreSilentTimingNamesWhatTheRiseWaitsFor: a restore whose own
// region is down waits for it to come back; one that waits for other
// regions names each of them.
func TestRestoreSilentTimingNamesWhatTheRiseWaitsFor(t *testing.T) {
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	self := restoreSilentTiming("eu-west", []regionView{{Region: "eu-west", Silent: true, SilentSince: &since}})
	wantContains(t, "restore of a silent region", self, "hears no report from eu-west since ", "not before eu-west is back and reports it")
	if strings.Contains(self, "leaves the config") || strings.Contains(self, "at most a few epochs") {
		t.Errorf("restore of a silent region: %s", self)
	}
	others := restoreSilentTiming("us-east", []regionView{{Region: "eu-west", Silent: true, SilentSince: &since}, {Region: "ap-south", Lapsed: true}})
	wantContains(t, "restore beside silent regions", others, "hears no report from eu-west since ", ", ap-south: us-east's static share",
		"not before eu-west and ap-south report again")
}

// shortPeriods is a config of two regions with the short periods of the
// live measurements the timing messages were checked against.
func shortPeriods(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(`
epoch: 250ms
grant_validity: 1s
region_lease: 4s
regions: {us-east: {weight: 1}, eu-west: {weight: 1}}
classes: {read: {}}
tiers: {free: {read: {rate: 10/s, burst: 10}}}
default_tier: free
`))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestRestoreTimingCountsTheConfirmationWait: a restored region's static
// share rises one grant validity and one epoch after every region reported
// the revision (make before break), and grants bring its share back before
// that. The message said it rose within "a few epochs", then grants: with
// epoch 250ms and grant_validity 1s the rise came 1.46 s after every
// region had reported, and grants had brought the share back before it.
func TestRestoreTimingCountsTheConfirmationWait(t *testing.T) {
	cfg := shortPeriods(t)
	msg := drainTiming(cfg, "eu-west", false)
	wantContains(t, "restore timing", msg, "grants bring eu-west's share back from the others, fenced",
		"static share rises once every region has reported this revision (a few epochs of 250ms)",
		"grant_validity + epoch = 1.25s more have passed")
	if strings.Contains(msg, "at most a few epochs") {
		t.Errorf("restore timing promises the rise within a few epochs: %s", msg)
	}
}

// TestDrainSilentTimingSaysWhatTheRegionCannotDo: a region the global
// tier does not hear from may still reach etcd (a partition from the
// global tier alone): it then loads the drain and runs on its floor at once
// (measured: 0.18 s after the write), but cannot report it. The message
// said it "cannot load this revision".
func TestDrainSilentTimingSaysWhatTheRegionCannotDo(t *testing.T) {
	cfg := shortPeriods(t)
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	msg := drainSilentTiming(cfg, "eu-west", &regionView{Region: "eu-west", Silent: true, SilentSince: &since})
	wantContains(t, "silent drain", msg, "it cannot report this revision", "loads it and runs on its floor",
		"the drain does not move its share sooner", "= 5.25s after its last report")
	if strings.Contains(msg, "cannot load") {
		t.Errorf("silent drain says the region cannot load the revision: %s", msg)
	}
}
