package envoyrls_test

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/envoyrls"
)

// resolveBenchConfig has a mapping and a tree whose buckets are one and
// two values of the request.
const resolveBenchConfig = `
regions: {local: {weight: 1}}
classes: {read: {}, per_ip: {}, per_user: {}}
tiers:
  std:
    read: {rate: 10/s, burst: 10}
    per_ip: {rate: 10/s, burst: 10}
    per_user: {rate: 10/s, burst: 10}
default_tier: std
envoy:
  descriptors:
    - {domain: edge, tenant_key: tenant, class: read}
  domains:
    - domain: edge
      descriptors:
        - {key: remote_address, class: per_ip}
        - key: service
          descriptors:
            - {key: user, class: per_user}
`

// BenchmarkResolve is Resolve alone on the common requests: a mapping's
// tenant, and a tree's bucket of one value and of two.
//
//	go test -run '^$' -bench '^BenchmarkResolve$' -benchmem ./pkg/envoyrls/
func BenchmarkResolve(b *testing.B) {
	cfg := regiontest.MustConfig(b, resolveBenchConfig)
	for _, c := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"mapping", request("edge", 0, desc("tenant", "acme"))},
		{"tree-one-value", request("edge", 0, desc("remote_address", "203.0.113.7"))},
		{"tree-two-values", request("edge", 0, desc("service", "billing", "user", "u-1234"))},
	} {
		b.Run(c.name, func(b *testing.B) {
			if ts, err := envoyrls.Resolve(cfg, c.req); err != nil || !ts[0].Matched {
				b.Fatalf("Resolve = %+v, %v; want a matched descriptor", ts, err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := envoyrls.Resolve(cfg, c.req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
