package agent_test

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// outageConfig: one leased and one strict class, both with the on_failure
// policy the test names.
const outageConfig = `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  read:   {mode: lease, on_failure: %[1]s}
  export: {mode: strict, on_failure: %[1]s}
tiers: {std: {read: {rate: 1/s, burst: 5}, export: {rate: 1/s, burst: 5}}}
default_tier: std
`

// TestOnFailureAppliedDuringAnOutageDecidesAtOnce: the region stops
// answering, and the operator switches the classes' on_failure in etcd
// (docs/operations.md, "Regional Redis down"). The agent's next degraded
// decision follows the config it applied, for keys the region answered
// before the outage (their grants and the config at start said open) and
// for keys it never answered, and again when the config is switched back.
// The lease client learned a key's policy only from the region's answers
// and the config at start, so it kept admitting under the old policy
// until the region came back.
func TestOnFailureAppliedDuringAnOutageDecidesAtOnce(t *testing.T) {
	ctx := context.Background()
	open := regiontest.MustConfig(t, fmt.Sprintf(outageConfig, "open"))
	closed := regiontest.MustConfig(t, fmt.Sprintf(outageConfig, "closed"))
	r, _ := region(t, open)
	etcd := etcdtest.Start(t)
	store := configstore.NewStore(etcd.Client(t), "/agenttest")
	w := configstore.NewWatcher(store, nil, nil, nil)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { w.Run(wctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	// The test judges that the agent follows each config, not how fast:
	// ten lease TTLs leave room for an etcd watch on a busy machine.
	patience := 10 * time.Duration(open.LeaseTTL)
	var rev int64
	apply := func(cfg *config.Config) {
		t.Helper()
		var err error
		if rev, err = store.Apply(ctx, cfg, rev); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(patience)
		for w.Revision() < rev {
			if time.Now().After(deadline) {
				t.Fatalf("the watcher did not apply revision %d within %v", rev, patience)
			}
			time.Sleep(5 * time.Millisecond) // polling the watcher with a deadline
		}
	}
	apply(open)
	a := startAgent(t, r.Addr, agent.Watched{W: w})
	web := httpClient(t)

	answered := []string{`{"tenant":"acme","class":"read"}`, `{"tenant":"acme","class":"export"}`}
	for _, body := range answered {
		if out := allow(t, web, a, body); !out.Allowed || out.Degraded {
			t.Fatalf("%s with the region up: %+v, want its admission", body, out)
		}
	}
	r.GRPC.Stop() // the region is out of reach from here on

	// Once the read key's lease is spent or expired, the agent decides
	// with the policy; open admits everything.
	deadline := time.Now().Add(patience)
	for {
		out := allow(t, web, a, answered[0])
		if out.Degraded {
			if !out.Allowed {
				t.Fatalf("degraded under on_failure open: %+v, want admitted", out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no degraded decision within %v of the region stopping", patience)
		}
	}
	keys := append(answered, `{"tenant":"newco","class":"read"}`, `{"tenant":"newco","class":"export"}`)
	for _, step := range []struct {
		cfg   *config.Config
		allow bool
	}{
		{closed, false},
		{open, true},
		{closed, false},
	} {
		apply(step.cfg)
		for _, body := range keys {
			out := allow(t, web, a, body)
			if !out.Degraded || out.Allowed != step.allow {
				t.Errorf("%s after on_failure %s was applied: %+v, want degraded with allowed %v",
					body, step.cfg.Classes["read"].OnFailure, out, step.allow)
			}
		}
	}
}

// TestNeverAnsweredKeyRunsWithinTheRegionsStaticShare: the region is out
// of reach before the agent ever asks it for a key of 4/s, burst 4,
// configured over regions local (weight 1) and far (weight 3), so its
// degraded decisions run the local policy with no region rate to divide.
// They ran at lease.Options.FallbackLimit, 10 at once and 10/s, whatever
// the key's limit; an agent told its region admits at most that region's
// static share (1/s, burst 1: 1 + 1/s · t), and one not told its region,
// or told one the config does not name (which it logs at start), at most
// the largest share of any (far's 3/s, burst 3: 3 + 3/s · t).
func TestNeverAnsweredKeyRunsWithinTheRegionsStaticShare(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}, far: {weight: 3}}
classes: {read: {mode: lease, on_failure: local}}
tiers: {std: {read: {rate: 4/s, burst: 4}}}
default_tier: std
`)
	r, _ := region(t, cfg)
	r.GRPC.Stop() // out of reach before any agent asks it anything
	web := httpClient(t)
	const unnamed = "the config names no such region"
	for _, tc := range []struct {
		region      string
		rate, burst float64 // the static share the agent's region holds
		unnamed     bool    // logs that the config does not name it
	}{
		{"local", 1, 1, false},
		{"", 3, 3, false},
		{"elsewhere", 3, 3, true},
	} {
		var logs logtest.Buffer
		a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg}, func(o *agent.Options) {
			o.Region, o.Logger = tc.region, slog.New(slog.NewTextHandler(&logs, nil))
		})
		if got := strings.Contains(logs.String(), unnamed); got != tc.unnamed {
			t.Errorf("region %q: logged %q: %v, want %v:\n%s", tc.region, unnamed, got, tc.unnamed, logs.String())
		}
		start := time.Now()
		admitted := 0
		for range 40 {
			out := allow(t, web, a, `{"tenant":"acme","class":"read"}`)
			if !out.Degraded {
				t.Fatalf("region %q: %+v with the region never reached, want degraded", tc.region, out)
			}
			if out.Allowed {
				admitted++
			}
		}
		elapsed := time.Since(start)
		bound := int(math.Floor(tc.burst + tc.rate*elapsed.Seconds()))
		if admitted < 1 || admitted > bound {
			t.Errorf("region %q: admitted %d of 40 in %v, want 1 to %d (burst %v + %v/s · t of the static share)",
				tc.region, admitted, elapsed, bound, tc.burst, tc.rate)
		}
		a.Stop()
	}
}
