package regional_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
	"google.golang.org/protobuf/proto"
)

// leaderGrantedAt is a leader of r's region whose global tier answers
// every report with grants of the given rates (burst equal to the rate,
// valid for validity) beside the allocator's own; tier records its reports,
// and applied reports the
// rate each key's grant was installed at (OnApplied).
func leaderGrantedAt(t *testing.T, r *leaseRig, validity time.Duration, rates map[quota.Key]float64) (*regional.Leader, *grantingTier, func() map[quota.Key]float64) {
	t.Helper()
	tier := &grantingTier{inner: r.tier}
	for _, k := range slices.SortedFunc(maps.Keys(rates), func(a, b quota.Key) int { return strings.Compare(a.String(), b.String()) }) {
		rate := rates[k]
		tier.grants = append(tier.grants, &sluicev1.KeyGrant{Key: &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class},
			Rate: rate, Burst: rate, ValidMs: validity.Milliseconds()})
	}
	var mu sync.Mutex
	applied := map[quota.Key]float64{}
	l, err := regional.NewLeader(r.srv, regional.LeaderOptions{
		Etcd: r.cli, ElectionPrefix: "/sl/election/", Global: tier, Identity: "eu-2",
		OnApplied: func(k quota.Key, rate, burst float64, expiryUS int64) {
			mu.Lock()
			applied[k] = rate
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return l, tier, func() map[quota.Key]float64 {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(applied)
	}
}

// grantingTier passes reports to the real allocator and returns its answer
// with grants in place of the allocator's and no raise pending, counting
// the reports sent.
type grantingTier struct {
	inner       regional.GlobalTier
	grants      []*sluicev1.KeyGrant
	reports     atomic.Int64
	first, last atomic.Pointer[sluicev1.RegionReport]
}

func (g *grantingTier) Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	g.reports.Add(1)
	g.first.CompareAndSwap(nil, r)
	g.last.Store(r)
	a, err := g.inner.Sync(ctx, r)
	if err != nil {
		return nil, err
	}
	a = proto.Clone(a).(*sluicev1.RegionGrants)
	a.Grants, a.ReportAgainMs = g.grants, 0
	return a, nil
}

// TestRefusedGrantIsNotCountedApplied: a grant set_rate refuses (its key
// already holds a grant answering a later report, as one installed by a
// newer leader) is not applied: OnApplied is not called for it, the
// grants-applied counter does not count it, and although it lowers the
// rate the region reported holding, no acknowledgement is sent for it (the
// round is one report). A grant for another key in the same answer is
// applied and counted; it is above that key's static share (50/s), so no
// acknowledgement is owed for it either.
func TestRefusedGrantIsNotCountedApplied(t *testing.T) {
	ctx := context.Background()
	r := newLongEpochRig(t)
	fenced := quota.Key{Tenant: "fenced", Class: "write"}
	fresh := quota.Key{Tenant: "fresh", Class: "write"}
	validity := time.Duration(r.cfg.GrantValidity)

	// The grant in force for fenced answers a report sent an hour from now,
	// later than the report of this test's round.
	keys, common, _, err := r.srv.CommonFor(r.cfg, fenced)
	if err != nil {
		t.Fatal(err)
	}
	now := r.redisUS()
	later := now + time.Hour.Microseconds()
	if sr, err := luascripts.New().SetRate(ctx, r.rdb, keys, common, 80, 80, later+time.Hour.Microseconds(), later, 0); err != nil || !sr.Applied {
		t.Fatalf("installing the newer grant: %+v, %v", sr, err)
	}

	l, tier, applied := leaderGrantedAt(t, r, validity, map[quota.Key]float64{fenced: 10, fresh: 60})
	counted0 := r.counter("sluice_regional_grants_applied_total")
	if err := l.SyncOnce(ctx, nil); err != nil {
		t.Fatal(err)
	}
	var held float64
	for _, kd := range tier.last.Load().GetKeys() {
		if kd.GetKey().GetTenant() == fenced.Tenant && kd.GetKey().GetClass() == fenced.Class {
			held = kd.GetHeldRate()
		}
	}
	if held != 80 {
		t.Fatalf("the report sent fenced holding %v/s, want the newer grant's 80/s", held)
	}
	got := applied()
	_, fencedApplied := got[fenced]
	freshRate, freshApplied := got[fresh]
	if fencedApplied {
		t.Error("OnApplied was called for the grant set_rate refused")
	}
	if !freshApplied || freshRate != 60 {
		t.Errorf("OnApplied for the fresh key: called %v at %v/s, want the grant of 60/s applied", freshApplied, freshRate)
	}
	if got := r.counter("sluice_regional_grants_applied_total") - counted0; got != 1 {
		t.Errorf("grants applied counted %v, want 1 (the fresh key's; not the refused one)", got)
	}
	if n := tier.reports.Load(); n != 1 {
		t.Errorf("the round sent %d reports, want 1: a refused grant lowers nothing, so no acknowledgement is owed", n)
	}
	st, err := luascripts.New().State(ctx, r.rdb, keys, common)
	if err != nil {
		t.Fatal(err)
	}
	if st.Rate != 80 {
		t.Errorf("fenced runs at %v/s, want the newer grant's 80/s still in force", st.Rate)
	}
}
