package allocator_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// heldGrant is a grant as a region holds it: expiry on the region's clock,
// from when it sent the report the grant answered.
type heldGrant struct {
	rate, burst float64
	until       time.Time
}

// regionSim follows the region contract of package hierarchy for one key:
// it echoes the grant it holds and measures validity from its send time.
type regionSim struct {
	name    string
	perSec  int64 // demand, tokens/s
	seq     uint64
	held    heldGrant
	holding func(h heldGrant, static float64) float64
}

func (r *regionSim) report(now time.Time) *sluicev1.RegionReport {
	r.seq++
	kd := &sluicev1.KeyDemand{Key: qk("acme", "write"), Admitted: r.perSec / 10, WindowMs: 100}
	if now.Before(r.held.until) {
		kd.HeldRate, kd.HeldBurst = r.held.rate, r.held.burst
		kd.HeldValidMs = r.held.until.Sub(now).Milliseconds()
		kd.Holding = r.holding(r.held, 0)
	} else {
		kd.Holding = r.holding(heldGrant{}, 50)
	}
	return report(r.name, r.seq, kd)
}

// rateAt is the refill rate the region may use at now: its grant while
// valid, else its static share (r/2 with two equal regions).
func (r *regionSim) rateAt(now time.Time) (rate, burst float64) {
	if now.Before(r.held.until) {
		return r.held.rate, r.held.burst
	}
	return 50, 50
}

// TestSyncEndToEnd drives a contended key over gRPC with two regions that
// follow the region contract: at every check the rates (and bursts) the
// regions may use sum to at most the key's limit, and the heavy region
// ends up with more than its static share. Then every bad report is
// refused with InvalidArgument naming the field.
func TestSyncEndToEnd(t *testing.T) {
	srv := etcdtest.Start(t)
	r := startReplica(t, srv, allocator.StaticConfig{C: mustConfig(t, twoRegions)}, testTTL)
	waitFor(t, 10*time.Second, "the replica leads", r.IsLeader)

	heavy := &regionSim{name: "a", perSec: 1000, holding: func(heldGrant, float64) float64 { return 0 }}
	light := &regionSim{name: "b", perSec: 10, holding: func(h heldGrant, static float64) float64 { return max(h.burst, static) }}
	const limit = 100.0
	ticker := time.NewTicker(testEpoch) // a region reports once per epoch
	defer ticker.Stop()
	deadline := time.Now().Add(15 * time.Second)
	var sawLearning, sawOutOfLearning bool
	for {
		for _, sim := range []*regionSim{heavy, light} {
			sent := time.Now()
			resp, err := r.api.Sync(rpcCtx(t), sim.report(sent))
			if status.Code(err) == codes.FailedPrecondition {
				// A starved replica's 1 s session may lapse: it answers
				// "not leader" until it wins a new term, which starts
				// learning again. The regions keep what they hold, and the
				// sums below stay checked across the change of term.
				t.Logf("Sync from %s: %v; waiting for a new term", sim.name, err)
				waitFor(t, 10*time.Second, "the replica leads again", r.IsLeader)
				deadline = time.Now().Add(15 * time.Second)
				continue
			}
			if err != nil {
				t.Fatalf("Sync from %s: %v", sim.name, err)
			}
			sawLearning = sawLearning || resp.Learning
			sawOutOfLearning = sawOutOfLearning || !resp.Learning
			for _, g := range resp.Grants {
				if g.Key.Tenant != "acme" || g.Key.Class != "write" {
					t.Fatalf("grant for a key nobody reported: %v", g)
				}
				if g.ValidMs <= 0 || time.Duration(g.ValidMs)*time.Millisecond > testValidity {
					t.Fatalf("grant valid for %dms, want 1..%v", g.ValidMs, testValidity)
				}
				sim.held = heldGrant{rate: g.Rate, burst: g.Burst, until: sent.Add(time.Duration(g.ValidMs) * time.Millisecond)}
			}
			now := time.Now()
			ra, ba := heavy.rateAt(now)
			rb, bb := light.rateAt(now)
			if ra+rb > limit*(1+1e-9) || ba+bb > limit*(1+1e-9) {
				t.Fatalf("oversubscribed: rates %v + %v, bursts %v + %v, limit %v", ra, rb, ba, bb, limit)
			}
		}
		if heavy.held.rate > 60 && time.Now().Before(heavy.held.until) {
			t.Logf("heavy region holds %+v, light region %+v", heavy.held, light.held)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the heavy region never got more than its static share: held %+v, light %+v", heavy.held, light.held)
		}
		<-ticker.C
	}
	if !sawLearning || !sawOutOfLearning {
		t.Fatalf("learning seen %v, left %v: want both", sawLearning, sawOutOfLearning)
	}
	st, err := r.api.Status(rpcCtx(t), &sluicev1.StatusRequest{TopKeys: 5})
	if err != nil || !st.Leader || st.ContendedKeys != 1 || len(st.Keys) != 1 || st.Keys[0].Rate != limit {
		t.Fatalf("status: %v %v", st, err)
	}
	if _, err := r.api.Status(rpcCtx(t), &sluicev1.StatusRequest{TopKeys: allocator.MaxStatusKeys + 1}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("status with too many keys asked: %v, want InvalidArgument", err)
	}
	m := scrape(t, r.Daemon)
	for _, want := range []string{
		"sluice_global_leader 1", "sluice_global_learning 0", "sluice_global_contended_keys 1",
		`sluice_global_grants_total{region="a"}`, `sluice_global_granted_rate{region="a"}`,
		`sluice_global_region_report_age_seconds{region="b"}`, "sluice_global_allocation_seconds_count",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, grep(m, "sluice_global_"))
		}
	}

	for _, c := range allocator.BadReports() {
		_, err := r.api.Sync(rpcCtx(t), c.Report)
		st, _ := status.FromError(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.Want) {
			t.Errorf("%s: got %v, want InvalidArgument containing %q", c.Name, err, c.Want)
		}
	}
	if m := scrape(t, r.Daemon); !strings.Contains(m, `sluice_global_reports_total{region="unknown",result="invalid"} 3`) {
		t.Errorf("invalid reports from unknown regions not counted:\n%s", grep(m, "reports_total"))
	}
}

const threeRegions = `
epoch: 100ms
grant_validity: 500ms
regions:
  a: {weight: 1}
  b: {weight: 1}
  c: {weight: 2}
classes:
  write: {}
tiers:
  free: {write: {rate: 100/s, burst: 100}}
default_tier: free
`

// TestConfigHotReload changes the regions in etcd while a replica leads
// on a configstore.Watcher: an added region is accepted and a removed one
// refused, without a restart.
func TestConfigHotReload(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	store := configstore.NewStore(cli, "/test")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rev, err := store.Apply(ctx, mustConfig(t, twoRegions), 0)
	if err != nil {
		t.Fatal(err)
	}
	w := configstore.NewWatcher(store, nil, nil, nil)
	wctx, stopWatcher := context.WithCancel(context.Background())
	watcherDone := make(chan error, 1)
	go func() { watcherDone <- w.Run(wctx) }()
	t.Cleanup(func() {
		stopWatcher()
		if err := <-watcherDone; err != nil {
			t.Errorf("watcher: %v", err)
		}
	})
	waitFor(t, 5*time.Second, "the watcher reads the config", func() bool { return w.Revision() == rev })

	r := startReplica(t, srv, w, testTTL)
	waitFor(t, 10*time.Second, "the replica leads", r.IsLeader)
	regions := func() []string {
		st, err := r.api.Status(rpcCtx(t), &sluicev1.StatusRequest{})
		if err != nil || !st.Leader {
			t.Fatalf("status: %v %v", st, err)
		}
		var names []string
		for _, rs := range st.Regions {
			names = append(names, rs.Region)
		}
		return names
	}
	if got := regions(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("regions %v, want [a b]", got)
	}
	if _, err := r.api.Sync(rpcCtx(t), report("c", 1, demand("acme", 10))); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Sync from a region not yet configured: %v, want InvalidArgument", err)
	}

	rev, err = store.Apply(ctx, mustConfig(t, threeRegions), rev)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "region c appears", func() bool { return slices.Equal(regions(), []string{"a", "b", "c"}) })
	if _, err := r.api.Sync(rpcCtx(t), report("c", 1, demand("acme", 10))); err != nil {
		t.Fatalf("Sync from the added region: %v", err)
	}
	st, err := r.api.Status(rpcCtx(t), &sluicev1.StatusRequest{})
	if err != nil || st.ConfigRevision != rev {
		t.Fatalf("status config revision %v (%v), want %d", st.GetConfigRevision(), err, rev)
	}

	withoutB := strings.Replace(threeRegions, "  b: {weight: 1}\n", "", 1)
	if _, err = store.Apply(ctx, mustConfig(t, withoutB), rev); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "region b is gone", func() bool { return slices.Equal(regions(), []string{"a", "c"}) })
	_, err = r.api.Sync(rpcCtx(t), report("b", 1, demand("acme", 10)))
	if s, _ := status.FromError(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), `region "b" is not configured`) {
		t.Fatalf("Sync from the removed region: %v", err)
	}
	if _, err := r.api.Sync(rpcCtx(t), report("a", 1, demand("acme", 10))); err != nil {
		t.Fatalf("Sync from a kept region: %v", err)
	}
}
