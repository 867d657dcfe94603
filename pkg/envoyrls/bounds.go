package envoyrls

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/pkg/rpcguard"
)

// Bounds on one ShouldRateLimit request, enforced before any decision (so
// before any Redis call) by the daemon's rpcguard interceptor: a request
// beyond them is refused with InvalidArgument naming the bound. Envoy
// sends one descriptor per matching rate_limits action of a route, a
// handful in practice.
const (
	// MaxDescriptors bounds the descriptors of one request
	// (bound descriptors_per_request).
	MaxDescriptors = 64
	// MaxEntries bounds the entries of one descriptor
	// (bound entries_per_descriptor).
	MaxEntries = 32
)

// Method is ShouldRateLimit's full gRPC method name.
const Method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// GuardRule is ShouldRateLimit's rpcguard rule: a request weighs one unit
// per descriptor, at most MaxDescriptors, each with at most MaxEntries
// entries.
func GuardRule() rpcguard.Rule {
	return rpcguard.Rule{
		Units: func(req any) int {
			r, _ := req.(*rlsv3.RateLimitRequest)
			return len(r.GetDescriptors())
		},
		Max:   MaxDescriptors,
		Bound: "descriptors_per_request",
		Check: func(req any) (string, string) {
			r, _ := req.(*rlsv3.RateLimitRequest)
			for i, d := range r.GetDescriptors() {
				if n := len(d.GetEntries()); n > MaxEntries {
					return "entries_per_descriptor", fmt.Sprintf("descriptors[%d] has %d entries, more than %d", i, n, MaxEntries)
				}
			}
			return "", ""
		},
		CheckBounds: map[string]int{"entries_per_descriptor": MaxEntries},
	}
}
