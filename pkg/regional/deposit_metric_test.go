package regional

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// TestDepositOfAnEndedGrantIsNotCounted: the leader installs an answer
// that arrives after its grant ended (set_rate applies it, since it
// orders later answers), but its deposit lands only under a grant in
// force (docs/architecture.md, "Burst transfer"), so
// sluice_regional_burst_deposited_tokens_total counts only the deposit of
// the grant still in force. Real redis-server.
func TestDepositOfAnEndedGrantIsNotCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, err := New(Options{Region: "local", Redis: redistest.Start(t).Client(), Config: StaticConfig{C: leaseConfig(t, "10s")}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	l := &Leader{s: srv, sync: regionsync.NewLeader()}
	metric := func(name string) float64 { return metrictest.Series(t, reg, name, nil) }
	ctx := context.Background()
	cfg := srv.opts.Config.Current()
	grant := func(validMs int64, deposit float64) *sluicev1.RegionGrants {
		return &sluicev1.RegionGrants{Region: "local", Grants: []*sluicev1.KeyGrant{{
			Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "read"}, Rate: 1, Burst: 200, ValidMs: validMs, Deposit: deposit,
		}}}
	}
	// Sent 10 s ago (this machine's clock is Redis's), valid for 1 s.
	sent := time.Now().Add(-10 * time.Second).UnixMicro()
	if _, err := l.install(ctx, cfg, grant(1000, 30), nil, nil, sent); err != nil {
		t.Fatal(err)
	}
	if got, applied := metric("sluice_regional_burst_deposited_tokens_total"), metric("sluice_regional_grants_applied_total"); got != 0 || applied != 1 {
		t.Fatalf("after an ended grant with a deposit of 30: deposited %v, applied %v; want 0 and 1", got, applied)
	}
	// A newer answer, its grant in force for a minute.
	if _, err := l.install(ctx, cfg, grant(60_000, 30), nil, nil, time.Now().UnixMicro()); err != nil {
		t.Fatal(err)
	}
	if got := metric("sluice_regional_burst_deposited_tokens_total"); got != 30 {
		t.Fatalf("after a grant in force with a deposit of 30: deposited %v, want 30", got)
	}
}
