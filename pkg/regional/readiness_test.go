package regional_test

import (
	"context"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// readiness watches a daemon's gRPC health as its readiness loop sets it.
type readiness struct {
	t    *testing.T
	d    *regional.Daemon
	wait time.Duration   // how long waitFor waits: many readiness intervals, as a starved machine checks late
	logs *logtest.Buffer // the daemon's log, shown when a wait fails (nil: none)
}

// serving reports whether the daemon's health is SERVING.
func (r readiness) serving() bool {
	resp, err := r.d.Health.Check(context.Background(), &healthpb.HealthCheckRequest{})
	return err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING
}

// waitFor polls ok, with a deadline of r.wait, and fails the test naming
// what it waited for.
func (r readiness) waitFor(what string, ok func() bool) {
	r.t.Helper()
	for deadline := time.Now().Add(r.wait); !ok(); {
		if time.Now().After(deadline) {
			log := ""
			if r.logs != nil {
				log = "; log:\n" + r.logs.String()
			}
			r.t.Fatalf("%s: not within %v%s", what, r.wait, log)
		}
		time.Sleep(regional.ReadinessInterval / 20) // polling the daemon with a deadline
	}
}
