package lease

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"
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
// multiplier, 0.2 jitter), capped at MaxReconnectDelay, and give an
// attempt up after ConnectTimeout.
func ConnectParams() grpc.ConnectParams {
	b := backoff.DefaultConfig
	b.MaxDelay = MaxReconnectDelay
	return grpc.ConnectParams{Backoff: b, MinConnectTimeout: ConnectTimeout}
}

// ConnectTimeout bounds one attempt to connect to a regional replica: the
// TCP connection, TLS and the HTTP/2 handshake. An attempt made while the
// path to the region was cut, and accepted but never answered (a gateway
// or load balancer whose upstream is unreachable, a path dropping
// packets), is given up after it and made again. With gRPC's default,
// 20 s, such an attempt held the connection until it ran out: an instance
// whose path came back went on deciding by on_failure for up to 20 s
// more. Five seconds leave room for a handshake over a slow or lossy link
// (a lost SYN costs 1 s, a second one 2 s more) and bound the wait after a
// partition heals to ConnectTimeout + MaxReconnectDelay (the region's own
// client to the global tier has the same bound, allocator.ConnectTimeout).
const ConnectTimeout = 5 * time.Second

// KeepaliveTime and KeepaliveTimeout are the lease client's HTTP/2
// keepalive (KeepaliveParams): a connection that has read nothing for
// KeepaliveTime is pinged, and closed when the ping is not answered within
// KeepaliveTimeout. KeepaliveTime is gRPC's least (a shorter one is
// raised to it); the regional service permits pings this often
// (internal/endpoint's enforcement policy).
const (
	KeepaliveTime    = 10 * time.Second
	KeepaliveTimeout = 3 * time.Second
)

// KeepaliveParams is the keepalive to dial the regional service with:
// grpc.WithKeepaliveParams(lease.KeepaliveParams()). A replica whose
// process is paused (SIGSTOP), or whose node froze or vanished without
// closing its connections, keeps them open: round_robin goes on sending
// it its share of the calls, each waiting out the breaker timeout, until
// the pod is restarted, or for the kernel's retransmission timeout (about
// 15 minutes) after a node is gone. With keepalive its connection is
// closed within KeepaliveTime + KeepaliveTimeout of its last answer, and
// a new one is not ready until it answers again, so calls go to the
// others meanwhile (docs/architecture.md, failure table: "regional replica
// hung"). Pings are sent without calls in flight too, so an idle instance
// finds the dead connection before its next request does.
func KeepaliveParams() keepalive.ClientParameters {
	return keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout, PermitWithoutStream: true}
}

// ServiceConfig is the gRPC service config to dial a region's replicas
// with: grpc.WithDefaultServiceConfig(lease.ServiceConfig). round_robin
// spreads the lease RPCs over every replica the target resolves to (they
// share all state through the region's Redis), and an Acquire, Sync or
// Release that fails UNAVAILABLE is sent once more, through the next
// pick. A replica that stops closes its connections, and a call the
// client sent on one before it read the close (a busy client, or a call
// in flight when the replica died) failed and was decided by on_failure
// although another replica answers; the retry takes it there. The three
// are safe to send twice: a report resent with the same seq and totals is
// answered with the grant already given (docs/architecture.md, invariant
// 5). Check is not retried: a strict check is not idempotent. Retries
// are throttled (retryThrottling: each failure takes one of 10 tokens,
// each success gives back a tenth, and below 5 nothing is retried), so a
// region that is down is not asked twice as often, and a retry still runs
// within the call's deadline (Options.BreakerTimeout).
const ServiceConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "methodConfig": [{
    "name": [
      {"service": "sluice.v1.LeaseService", "method": "Acquire"},
      {"service": "sluice.v1.LeaseService", "method": "Sync"},
      {"service": "sluice.v1.LeaseService", "method": "Release"}
    ],
    "retryPolicy": {
      "maxAttempts": 2,
      "initialBackoff": "0.001s",
      "maxBackoff": "0.001s",
      "backoffMultiplier": 1,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }],
  "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
}`
