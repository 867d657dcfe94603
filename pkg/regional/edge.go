package regional

import (
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/rpcauth"
	"github.com/sluicehq/sluice/pkg/rpcguard"
)

// Bounds on the work of one call to a regional service, enforced before
// any Redis call (docs/operations.md, "Request bounds").
const (
	// MaxReportsPerCall bounds the reports of one Sync or Release
	// (bounds reports_per_sync, reports_per_release): twice what a lease
	// client sends by default, which splits larger batches.
	MaxReportsPerCall = 1000
	// MaxMessageBytes bounds one received gRPC message.
	MaxMessageBytes = 1 << 20
	// MaxStreamsPerConnection bounds the calls one connection may have
	// open, served or waiting.
	MaxStreamsPerConnection = 1024
)

// Full method names of the LeaseService.
const (
	leaseService  = "/" + "sluice.v1.LeaseService"
	methodSync    = leaseService + "/Sync"
	methodRelease = leaseService + "/Release"
)

// Policy is who may call what on a regional service under mutual TLS:
// instances the LeaseService, Envoy the rate limit service, operators
// reflection, everyone authenticated health checks.
func Policy() rpcauth.Policy {
	return rpcauth.Policy{
		leaseService + "/*":       {Role: config.RoleInstance},
		envoyrls.Method:           {Role: config.RoleEnvoy},
		rpcauth.HealthService:     {Any: true},
		rpcauth.ReflectionV1:      {Role: config.RoleOperator},
		rpcauth.ReflectionV1Alpha: {Role: config.RoleOperator},
	}
}

// GuardRules are the per-request bounds of a regional service.
func GuardRules() map[string]rpcguard.Rule {
	reports := func(req any) int {
		switch r := req.(type) {
		case *sluicev1.SyncRequest:
			return len(r.GetReports())
		case *sluicev1.ReleaseRequest:
			return len(r.GetReports())
		}
		return 1
	}
	return map[string]rpcguard.Rule{
		methodSync:      {Units: reports, Max: MaxReportsPerCall, Bound: "reports_per_sync"},
		methodRelease:   {Units: reports, Max: MaxReportsPerCall, Bound: "reports_per_release"},
		envoyrls.Method: envoyrls.GuardRule(),
	}
}
