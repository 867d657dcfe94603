package regional

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
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
	l := newLeader(srv, LeaderOptions{})
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

// TestAGrantOfARemovedClassIsToldOnceAMinute: after a config change that
// removes a class, the global tier grants the class's keys until it
// confirms the revision. The region, which no longer has the class,
// ignores those grants and says so at INFO once a minute per class, not a
// WARN of an invalid key every epoch; a key invalid for another reason is
// still a WARN, also once a minute. Nothing is installed.
func TestAGrantOfARemovedClassIsToldOnceAMinute(t *testing.T) {
	var logs logtest.Buffer
	srv, err := New(Options{Region: "local", Redis: redistest.Start(t).Client(), Config: StaticConfig{C: leaseConfig(t, "10s")},
		Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	l := newLeader(srv, LeaderOptions{})
	cfg := srv.opts.Config.Current()
	grant := func(tenant, class string) *sluicev1.RegionGrants {
		return &sluicev1.RegionGrants{Region: "local", Grants: []*sluicev1.KeyGrant{{
			Key: &sluicev1.QuotaKey{Tenant: tenant, Class: class}, Rate: 1, Burst: 10, ValidMs: 5000,
		}}}
	}
	for range 3 {
		for _, g := range []*sluicev1.RegionGrants{grant("acme", "gone"), grant("ac}me", "read")} {
			if _, err := l.install(t.Context(), cfg, g, nil, nil, time.Now().UnixMicro()); err != nil {
				t.Fatal(err)
			}
		}
	}
	out := logs.String()
	if n := strings.Count(out, `level=INFO msg="global tier granted a key of a class this region's config no longer has`); n != 1 || !strings.Contains(out, "class=gone") {
		t.Errorf("the removed class told %d times at INFO, want once naming it:\n%s", n, out)
	}
	if n := strings.Count(out, `level=WARN msg="global tier granted an invalid key; ignored"`); n != 1 {
		t.Errorf("the invalid key told %d times at WARN, want once:\n%s", n, out)
	}
	if strings.Contains(out, "class=gone") && strings.Contains(out, `WARN msg="global tier granted an invalid key; ignored" err="invalid: grant.key: class \"gone\"`) {
		t.Errorf("the removed class was told as an invalid key:\n%s", out)
	}
	if keys, err := srv.opts.Redis.Keys(t.Context(), "*gone*").Result(); err != nil || len(keys) != 0 {
		t.Fatalf("Redis keys of the removed class: %v, %v; want none", keys, err)
	}
}
