package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// hungReplica is a regional replica that accepted its connections and
// then stopped answering (a paused process, a frozen node): every call
// waits until its caller gives up. A fault no real replica produces on
// demand in-process.
type hungReplica struct {
	sluicev1.UnimplementedLeaseServiceServer
}

func (hungReplica) Acquire(ctx context.Context, _ *sluicev1.AcquireRequest) (*sluicev1.AcquireResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (hungReplica) Sync(ctx context.Context, _ *sluicev1.SyncRequest) (*sluicev1.SyncResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestOneHungReplicaOfTwoSendsOnlyItsCallsToThePolicy: an instance
// balancing over two replicas of its region, one of which hangs, decides
// by its on_failure policy only the requests whose calls went to the hung
// one; the healthy replica answers the rest. The hung replica's calls time
// out together, but the region answered calls sent after them, so they are
// no evidence of an outage: the breaker stays closed (it opened, and every
// request of every key went to the policy for as long as the hang lasted).
func TestOneHungReplicaOfTwoSendsOnlyItsCallsToThePolicy(t *testing.T) {
	// A region and a hung replica of its own, and mostly waiting on
	// timeouts and ticks: it runs beside the package's other parallel tests.
	t.Parallel()
	const (
		callers  = 8
		requests = 24 // per caller, each on a key of its own
		timeout  = 300 * time.Millisecond
	)
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease, on_failure: local}}
tiers: {free: {read: {rate: 10/s, burst: 20}}}
default_tier: free
`)
	c, _ := balancedOverAHungReplica(t, cfg, timeout)

	var mu sync.Mutex
	answered, degraded := 0, 0
	var wg sync.WaitGroup
	for g := range callers {
		wg.Go(func() {
			for i := range requests {
				d, err := c.Allow(context.Background(), quota.Key{Tenant: fmt.Sprintf("c%d-%d", g, i), Class: "read"}, 1)
				mu.Lock()
				switch {
				case err != nil:
					t.Errorf("Allow: %v", err)
				case d.Degraded:
					degraded++
				default:
					answered++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	total := callers * requests
	t.Logf("%d of %d requests answered by the region, %d by the policy", answered, total, degraded)
	// Round robin sends the healthy replica about half the calls; with the
	// breaker open most would be skipped.
	if 3*answered < total {
		t.Errorf("%d of %d requests answered by the healthy replica; want at least a third", answered, total)
	}
}

// balancedOverAHungReplica is a lease client balancing round robin over a
// real regional replica of cfg and a hung one, with the given breaker
// timeout, once the healthy replica answered it; and the healthy region.
func balancedOverAHungReplica(t *testing.T, cfg *config.Config, timeout time.Duration) (*lease.Client, *regiontest.Region) {
	t.Helper()
	healthy := regiontest.Start(t, cfg, "local")
	hung := grpc.NewServer()
	sluicev1.RegisterLeaseServiceServer(hung, hungReplica{})
	hungAddr := grpctest.Serve(t, hung)

	c := balancedClient(t, []string{healthy.Addr, hungAddr}, timeout)
	// Both replicas take calls once each answered the connection: warm
	// up until the healthy one answered a request (the hung one's first
	// calls also time out meanwhile).
	deadline := time.Now().Add(100 * timeout)
	for i := 0; ; i++ {
		d, err := c.Allow(context.Background(), quota.Key{Tenant: fmt.Sprintf("warm%d", i), Class: "read"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if !d.Degraded && d.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the healthy replica answered none of %d requests in %v", i+1, 100*timeout)
		}
		time.Sleep(timeout / 10) // poll: the breaker may be open for its cooldown
	}
	return c, healthy
}

// balancedClient is a lease client balancing round robin over the
// replicas at addrs, with the given breaker timeout and dial options,
// closed at cleanup.
func balancedClient(t *testing.T, addrs []string, timeout time.Duration, dial ...grpc.DialOption) *lease.Client {
	t.Helper()
	r := manual.NewBuilderWithScheme("replicas")
	var state resolver.State
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	r.InitialState(state)
	conn, err := grpc.NewClient(r.Scheme()+":///region", append([]grpc.DialOption{grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`)}, dial...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, err := lease.NewClient(conn, lease.Options{InstanceID: "balanced", BreakerTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*timeout)
		defer cancel()
		c.Close(ctx)
	})
	return c
}

// TestOneHungReplicaOfTwoAdmitsNoMoreThanTheKeysBound: a key served by
// the healthy replica of two while the other hangs admits, leased and
// degraded together, about b + r·t: a request whose call went to the hung
// replica while the region answered later calls is denied, to be retried,
// not decided by on_failure, and the local bucket is charged with what
// the lease spent (local admitted its own tokens on top of the lease the
// healthy replica kept filling: 27 a second over a 20/s key, 29-42 tokens
// over b + r·t in 8s). Within one local burst: the local bucket books the
// lease's spending at the next degraded decision, at most a burst at a
// time, on the instance's clock (runs exceeded b + r·t by a token).
func TestOneHungReplicaOfTwoAdmitsNoMoreThanTheKeysBound(t *testing.T) {
	// A region and a hung replica of its own, and mostly waiting on
	// timeouts and ticks: it runs beside the package's other parallel tests.
	t.Parallel()
	const (
		timeout = 200 * time.Millisecond
		run     = 8 * time.Second
		every   = 5 * time.Millisecond // 200/s offered against 20/s
		burst   = 20.0
		rate    = 20.0
	)
	cfg := regiontest.MustConfig(t, `
regions: {local: {weight: 1}}
classes: {read: {mode: lease, on_failure: local}}
tiers: {free: {read: {rate: 20/s, burst: 20}}}
default_tier: free
`)
	c, healthy := balancedOverAHungReplica(t, cfg, timeout)
	key := quota.Key{Tenant: "acme", Class: "read"}
	start := healthy.RedisNow(t)
	admitted, degraded := 0, 0
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 4 { // several callers, so some wait on the hung replica while others are served
		wg.Go(func() {
			tick := time.NewTicker(4 * every)
			defer tick.Stop()
			for end := time.Now().Add(run); time.Now().Before(end); <-tick.C {
				d, err := c.Allow(context.Background(), key, 1)
				mu.Lock()
				switch {
				case err != nil:
					t.Errorf("Allow: %v", err)
				case d.Allowed:
					admitted++
					if d.Degraded {
						degraded++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	end := healthy.RedisNow(t)
	bound := burst + rate*end.Sub(start).Seconds()
	t.Logf("admitted %d (%d of them degraded); b + r·t = %.1f", admitted, degraded, bound)
	if float64(admitted) > bound+burst {
		t.Errorf("admitted %d (%d degraded) with one replica of two hung; b + r·t = %.1f, and one local burst more at most", admitted, degraded, bound)
	}
}
