package agent_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestAListOfReplicasSpreadsLeasesAndSurvivesOneStopping: -region-addr
// naming two replicas of one region (one Redis) sends the agent's lease
// RPCs to both, and with one of them stopped the other answers every new
// key from a lease: nothing is decided by on_failure. With one address, a
// stopped replica left the agent degraded until it came back.
func TestAListOfReplicasSpreadsLeasesAndSurvivesOneStopping(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	rs := redistest.Start(t)
	var regs [2]*prometheus.Registry
	var replicas [2]*regiontest.Region
	for i := range replicas {
		regs[i] = prometheus.NewRegistry()
		replicas[i] = regiontest.StartOn(t, rs, cfg, "local", func(o *regional.Options) { o.Registerer = regs[i] })
	}
	a := startAgent(t, replicas[0].Addr+","+replicas[1].Addr, agent.StaticConfig{C: cfg})
	web := httpClient(t)
	acquires := func(i int) float64 {
		return metrictest.Series(t, regs[i], "sluice_regional_requests_total", map[string]string{"method": "Acquire", "code": "OK"})
	}
	n := 0
	fresh := func() agent.AllowResponse {
		n++
		return allow(t, web, a, fmt.Sprintf(`{"tenant":"t%d","class":"read"}`, n))
	}
	deadline := time.Now().Add(10 * time.Second)
	for acquires(0) == 0 || acquires(1) == 0 {
		if out := fresh(); !out.Allowed || out.Degraded {
			t.Fatalf("a fresh key with both replicas up: %+v", out)
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d fresh keys, acquires per replica %v and %v: the list is not spread", n, acquires(0), acquires(1))
		}
	}

	replicas[0].GRPC.Stop()
	// The connection to the stopped replica may carry one more call
	// before gRPC sees it close; from the first answer from a lease on, the
	// other replica answers every new key.
	for out := fresh(); out.Degraded; out = fresh() {
		if time.Now().After(deadline) {
			t.Fatal("with one replica stopped, fresh keys are still decided by on_failure")
		}
	}
	for range 20 {
		if out := fresh(); !out.Allowed || out.Degraded {
			t.Fatalf("fresh key %d with one replica of two stopped: %+v; want it leased from the other", n, out)
		}
	}
}
