package agent_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestAgentWithoutTheInstanceRoleSaysItIsRefused: an agent whose
// certificate holds the envoy role but not instance, against a regional
// daemon under mutual TLS, decides by on_failure (degraded), and its own
// /metrics and log say the region refuses its credentials, naming the
// missing role, rather than that the region is unreachable.
func TestAgentWithoutTheInstanceRoleSaysItIsRefused(t *testing.T) {
	pki := regiontest.RolesPKI(t, "sidecar")
	cfg := regiontest.RolesConfig(t, "sidecar", "envoy")
	d := regiontest.StartMTLS(t, pki, regional.StaticConfig{C: cfg})
	var logs logtest.Buffer
	a, err := agent.Start(agent.Options{
		RegionAddr: d.GRPCAddr(), RegionCreds: pki.Creds(t, "sidecar", "localhost"), Config: agent.StaticConfig{C: cfg},
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		Lease:  lease.Options{BreakerTimeout: 10 * time.Second},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	hc := httpClient(t)
	if out := allow(t, hc, a, `{"tenant":"acme","class":"read"}`); !out.Degraded {
		t.Fatalf("an agent the region refuses decided %+v from a lease", out)
	}
	body := metrictest.Scrape(t, "http://"+a.MetricsAddr()+"/metrics")
	for _, want := range []string{"\nsluice_client_credentials_refused 1\n", "\nsluice_client_degraded 1\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("the agent's /metrics lacks %q", strings.TrimSpace(want))
		}
	}
	text := logs.String()
	var named bool
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "level=ERROR") && strings.Contains(line, "refused this client's credentials") &&
			strings.Contains(line, "needs=instance") && strings.Contains(line, "code=PermissionDenied") {
			named = true
		}
	}
	if !named {
		t.Errorf("no error line names the refusal and the missing role:\n%s", text)
	}
	if strings.Contains(text, "unreachable") {
		t.Errorf("the agent logs a region that answers as unreachable:\n%s", text)
	}
}
