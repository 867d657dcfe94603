package lease

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// MaxReconnectDelay caps the wait between two attempts to reconnect to a
// regional service: the scale of the breaker's cooldown
// (DefaultBreakerCooldown), so that once the region is back an instance
// is connected again by the time its breaker lets a probe through.
const MaxReconnectDelay = 2 * time.Second

// ConnectParams are the reconnect settings to dial the regional service
// with: grpc.WithConnectParams(lease.ConnectParams()). gRPC's default
// backoff doubles, roughly, up to 120 s, so after an outage of a minute a
// connection may try again only tens of seconds after the region came
// back, and the instance decides with on_failure (degraded) all that time
// although the region answers. These keep gRPC's backoff (1 s base, 1.6
// multiplier, 0.2 jitter) and its 20 s connect timeout, capped at
// MaxReconnectDelay.
func ConnectParams() grpc.ConnectParams {
	b := backoff.DefaultConfig
	b.MaxDelay = MaxReconnectDelay
	return grpc.ConnectParams{Backoff: b, MinConnectTimeout: 20 * time.Second}
}
