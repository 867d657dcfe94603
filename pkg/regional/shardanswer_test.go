package regional_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/shard"
)

// editTier passes reports to one real allocator shard and edits its
// answers: the grants set in place of the allocator's, and report_again_ms
// set on the next answer only (0 on the others). It counts the reports
// sent since the last set, and keeps when each arrived and when the first
// was answered.
type editTier struct {
	inner regional.GlobalTier

	mu       sync.Mutex
	grants   []*sluicev1.KeyGrant
	againMs  int64
	reports  int
	arrived  []time.Time
	answered time.Time // the first report's answer
}

func (e *editTier) Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	arrived := time.Now()
	g, err := e.inner.Sync(ctx, r)
	if err != nil {
		return nil, err
	}
	g = proto.Clone(g).(*sluicev1.RegionGrants)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reports++
	e.arrived = append(e.arrived, arrived)
	g.Grants, g.ReportAgainMs = e.grants, e.againMs
	e.againMs = 0
	if e.answered.IsZero() {
		e.answered = time.Now()
	}
	return g, nil
}

func (e *editTier) set(grants []*sluicev1.KeyGrant, againMs int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.grants, e.againMs, e.reports = grants, againMs, 0
	e.arrived, e.answered = nil, time.Time{}
}

// caughtUpAfter is how long after its first answer the second report
// arrived (0 when there was none).
func (e *editTier) caughtUpAfter() time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.arrived) < 2 {
		return 0
	}
	return e.arrived[1].Sub(e.answered)
}

func (e *editTier) sent() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reports
}

// twoShardRig is a leaseRig whose config names two allocator shards, each a
// real allocator daemon reached through an editTier, and a leader of eu on
// them recording the grants it applies.
type twoShardRig struct {
	*leaseRig
	tiers  [2]*editTier
	leader *regional.Leader

	mu      sync.Mutex
	applied map[quota.Key][]float64
}

func newTwoShardRig(t *testing.T, cfg *config.Config) *twoShardRig {
	t.Helper()
	r := &twoShardRig{leaseRig: newLeaseRigWith(t, cfg), applied: map[quota.Key][]float64{}}
	d1, err := allocator.StartDaemon(context.Background(), allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", Etcd: r.cli, Prefix: "/sl", SessionTTL: 10 * time.Second,
		Shard: 1, Config: regional.StaticConfig{C: cfg},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d1.Stop)
	awaitAllocatorLeader(t, d1, 10*time.Second)
	r.tiers = [2]*editTier{{inner: serviceTier{r.alloc.Service}}, {inner: serviceTier{d1.Service}}}
	r.leader, err = regional.NewLeader(r.srv, regional.LeaderOptions{
		Etcd: r.cli, ElectionPrefix: "/sl/election/", Global: r.tiers[0], Identity: "eu-2",
		Shards: func(i int) (regional.GlobalTier, error) { return r.tiers[i], nil },
		OnApplied: func(k quota.Key, rate, burst float64, expiryUS int64) {
			r.mu.Lock()
			r.applied[k] = append(r.applied[k], rate)
			r.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ownedBy is a key of class write that shard i owns under m.
func ownedBy(t *testing.T, m shard.Map, i int) quota.Key {
	t.Helper()
	for n := range 1000 {
		if k := (quota.Key{Tenant: fmt.Sprintf("t%03d", n), Class: "write"}); m.Of(k) == i {
			return k
		}
	}
	t.Fatalf("no key of 1000 is shard %d's", i)
	return quota.Key{}
}

func twoShardConfig(t *testing.T) *config.Config {
	t.Helper()
	// A round must run within its epoch, and a catch-up waits at most an
	// epoch: a long one, which a starved machine's round fits in and
	// which a catch-up at the wrong shard's delay is seen to outlast.
	return regiontest.MustConfig(t, `
epoch: 20s
lease_ttl: 1m
global_shards: 2
regions: {eu: {weight: 1}, us: {weight: 1}}
classes: {write: {mode: lease}}
tiers: {free: {write: {rate: 100/s, burst: 100}}}
default_tier: free
`)
}

// TestShardAnswerInstallsOnlyItsOwnKeys: a region takes a key's grants
// only from the shard that owns it under the map it runs. Shard 0 answers
// with grants for its own key and for shard 1's; shard 1 grants nothing.
// Only shard 0's own key is installed; shard 1's key keeps its static
// share. The grants are above the static share (50/s), so neither owes an
// acknowledgement and the round is one report.
func TestShardAnswerInstallsOnlyItsOwnKeys(t *testing.T) {
	ctx := context.Background()
	cfg := twoShardConfig(t)
	r := newTwoShardRig(t, cfg)
	own, other := ownedBy(t, cfg.ShardMap(), 0), ownedBy(t, cfg.ShardMap(), 1)
	validMs := time.Duration(cfg.GrantValidity).Milliseconds()
	r.tiers[0].set([]*sluicev1.KeyGrant{
		{Key: &sluicev1.QuotaKey{Tenant: own.Tenant, Class: own.Class}, Rate: 60, Burst: 60, ValidMs: validMs},
		{Key: &sluicev1.QuotaKey{Tenant: other.Tenant, Class: other.Class}, Rate: 70, Burst: 70, ValidMs: validMs},
	}, 0)
	r.tiers[1].set(nil, 0)
	if err := r.leader.SyncOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	ownRates, otherRates := r.applied[own], r.applied[other]
	r.mu.Unlock()
	if len(ownRates) != 1 || ownRates[0] != 60 {
		t.Errorf("shard 0's own key %v: applied %v, want shard 0's grant of 60/s once", own, ownRates)
	}
	if len(otherRates) != 0 {
		t.Errorf("shard 1's key %v: applied %v from shard 0, which does not own it", other, otherRates)
	}
	keys, common, _, err := r.srv.CommonFor(cfg, other)
	if err != nil {
		t.Fatal(err)
	}
	st, err := luascripts.New().State(ctx, r.rdb, keys, common)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rate == 70 {
		t.Errorf("shard 1's key %v runs at shard 0's grant of 70/s", other)
	}
}

// TestShardedRoundCatchesUpAtTheSoonestAsk: when the shards' answers ask
// for a catch-up report (a raise pending) after different delays, the
// round's catch-up goes after the soonest delay asked, whichever shard
// asked it; one shard asking is enough; none asking ends the round with
// its report. A catch-up waits at most an epoch, so one sent at the later
// delay (an hour here) would still be waiting half an epoch on; and at
// least the soonest delay, so it reaches each shard no sooner than that
// after the shard answered the round's first report.
func TestShardedRoundCatchesUpAtTheSoonestAsk(t *testing.T) {
	ctx := context.Background()
	cfg := twoShardConfig(t)
	r := newTwoShardRig(t, cfg)
	epoch := time.Duration(cfg.Epoch)
	hour := time.Hour.Milliseconds()
	const soon = 100 // ms
	for _, tc := range []struct {
		name    string
		againMs [2]int64
		catchUp bool
	}{
		{name: "shard 0 asks sooner", againMs: [2]int64{soon, hour}, catchUp: true},
		{name: "shard 1 asks sooner", againMs: [2]int64{hour, soon}, catchUp: true},
		{name: "only shard 0 asks", againMs: [2]int64{soon, 0}, catchUp: true},
		{name: "only shard 1 asks", againMs: [2]int64{0, soon}, catchUp: true},
		{name: "no shard asks", againMs: [2]int64{0, 0}, catchUp: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, tier := range r.tiers {
				tier.set(nil, tc.againMs[i])
			}
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- r.leader.SyncOnce(rctx, nil) }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(epoch / 2):
				cancel()
				<-done
				t.Fatalf("the round still waited to catch up half an epoch (%v) on, after sending %d and %d reports", epoch/2, r.tiers[0].sent(), r.tiers[1].sent())
			}
			want := 1
			if tc.catchUp {
				want = 2
			}
			for i, tier := range r.tiers {
				if got := tier.sent(); got != want {
					t.Errorf("shard %d got %d reports, want %d", i, got, want)
				}
				if after := tier.caughtUpAfter(); tc.catchUp && after < soon*time.Millisecond {
					t.Errorf("shard %d got the catch-up %v after its first answer, before the %d ms asked", i, after, soon)
				}
			}
		})
	}
}
