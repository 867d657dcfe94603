package lease_test

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
)

// slowRegion refills so slowly (1 token an hour) that what a test admits
// is the burst alone, to the token: b + r·t = 100 + t/3600s.
const slowRegion = `
lease_ttl: 3s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  read: {mode: lease, on_failure: closed}
tiers:
  free: {read: {rate: 1/h, burst: 100}}
default_tier: free
`

// faultConn sends the lease RPCs to one replica and Release to another,
// drops every Sync while armed (the replica it goes to is down), and
// records what the region granted and put back.
type faultConn struct {
	primary, other grpc.ClientConnInterface
	dropSync       atomic.Bool
	dropped        atomic.Int64

	mu       sync.Mutex
	granted  int64
	putBack  int64
	released int
}

func (f *faultConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	switch method {
	case sluicev1.LeaseService_Sync_FullMethodName:
		if f.dropSync.Load() {
			f.dropped.Add(1)
			return status.Error(codes.Unavailable, "replica down (injected)")
		}
	case sluicev1.LeaseService_Release_FullMethodName:
		err := f.other.Invoke(ctx, method, args, reply, opts...)
		if err == nil {
			f.mu.Lock()
			f.putBack += reply.(*sluicev1.ReleaseResponse).GetReturned()
			f.released++
			f.mu.Unlock()
		}
		return err
	}
	err := f.primary.Invoke(ctx, method, args, reply, opts...)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r := reply.(type) {
	case *sluicev1.AcquireResponse:
		f.granted += r.GetGrant().GetGranted()
	case *sluicev1.SyncResponse:
		for _, g := range r.GetGrants() {
			f.granted += g.GetGranted()
		}
		for _, rep := range args.(*sluicev1.SyncRequest).GetReports() {
			if rep.GetReturned() > 0 {
				panic("test expects no tokens returned by Sync")
			}
		}
	}
	return nil
}

func (f *faultConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "no streams")
}

// TestReleaseAfterLostSyncIsExact: an instance's Sync is built (its usage
// taken into a report) but never reaches the region, nor does its resend
// at Close; the final Release reaches another replica. The region must put
// back exactly granted - spent: the release's totals include the usage of
// the report that was lost.
func TestReleaseAfterLostSyncIsExact(t *testing.T) {
	cfg := regiontest.MustConfig(t, slowRegion)
	rs := redistest.Start(t)
	a := regiontest.StartOn(t, rs, cfg, "local")
	b := regiontest.StartOn(t, rs, cfg, "local")
	fc := &faultConn{primary: a.Dial(t), other: b.Dial(t)}
	// The Release at Close is one RPC bounded by SyncTimeout: the default
	// (Refresh/2) is short for a replica starved of CPU, and what is
	// judged here is the release's totals, not its latency.
	c, err := lease.NewClient(fc, lease.Options{InstanceID: "lost-sync", Refresh: time.Second, BreakerTimeout: 2 * time.Second, SyncTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	fc.dropSync.Store(true)
	var spent int64
	for i := 0; i < 30; i++ {
		if d := mustAllow(t, c, acmeRead, 1); d.Allowed && !d.Degraded {
			spent++
		}
	}
	if spent != 30 {
		t.Fatalf("admitted %d of 30 from the lease", spent)
	}
	// The usage goes into a Sync that is lost: one sent after the last
	// Allow (a Sync dropped earlier, say a refill before any spending,
	// may carry none of it, and then Close has nothing to resend).
	before := fc.dropped.Load()
	waitFor(t, "a Sync carrying the usage to be dropped", func() bool { return fc.dropped.Load() > before })
	if err := c.Close(context.Background()); err == nil {
		t.Fatal("Close: the resend of the lost report should have failed too")
	}
	fc.mu.Lock()
	granted, putBack, released := fc.granted, fc.putBack, fc.released
	fc.mu.Unlock()
	if released != 1 {
		t.Fatalf("%d releases reached the second replica, want 1", released)
	}
	if putBack != granted-spent {
		t.Fatalf("region put back %d tokens; granted %d - spent %d = %d", putBack, granted, spent, granted-spent)
	}
	st := (env{reg: a, cfg: cfg}).regionState(t, acmeRead)
	if st.Outstanding != 0 || math.Floor(st.Tokens) != float64(100-spent) {
		t.Fatalf("region holds %v tokens, %d out; want %d, 0", st.Tokens, st.Outstanding, 100-spent)
	}
}

// swapConfig is a ConfigSource a test can hot-reload.
type swapConfig struct{ p atomic.Pointer[config.Config] }

func (s *swapConfig) Current() *config.Config { return s.p.Load() }

// TestModeSwitchKeepsLeaseAccounting: a class switched from lease to strict
// by a hot reload while a lease is out. The lease's usage and returns are
// still applied, the lease ends exactly, and the strict path then admits
// only what is left: admitted across the switch stays within b + r·t on
// Redis time.
func TestModeSwitchKeepsLeaseAccounting(t *testing.T) {
	lcfg := regiontest.MustConfig(t, slowRegion)
	scfg := regiontest.MustConfig(t, `
lease_ttl: 3s
refresh: 1s
regions: {local: {weight: 1}}
classes:
  read: {mode: strict, on_failure: closed}
tiers:
  free: {read: {rate: 1/h, burst: 100}}
default_tier: free
`)
	src := &swapConfig{}
	src.p.Store(lcfg)
	reg := regiontest.Start(t, lcfg, "local", func(o *regional.Options) { o.Config = src })
	e := env{reg: reg, cfg: lcfg}
	start := reg.RedisNow(t)
	c, err := lease.NewClient(reg.Dial(t), lease.Options{InstanceID: "mode-switch", Refresh: time.Second, BreakerTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var admitted int64
	for i := 0; i < 60; i++ {
		if d := mustAllow(t, c, acmeRead, 1); d.Allowed && !d.Degraded {
			admitted++
		}
	}
	if st, _ := c.Table().State(acmeRead); !st.HasLease {
		t.Fatal("no lease before the switch")
	}
	src.p.Store(scfg)
	e.cfg = scfg
	waitFor(t, "the client to learn the strict mode", func() bool {
		st, ok := c.Table().State(acmeRead)
		return !ok || st.Mode == lease.ModeStrict
	})
	// The lease ends: released by the client, or at the latest reaped one
	// lease TTL after its last report.
	waitFor(t, "the lease to end", func() bool { return e.regionState(t, acmeRead).Outstanding == 0 })
	for i := 0; i < 200; i++ {
		if d := mustAllow(t, c, acmeRead, 1); d.Allowed && !d.Degraded {
			admitted++
		}
	}
	elapsed := reg.RedisNow(t).Sub(start)
	if bound := 100 + elapsed.Hours(); float64(admitted) > bound {
		t.Fatalf("admitted %d across the switch to strict; b + r·t = %.3f", admitted, bound)
	}
	if admitted != 100 {
		t.Fatalf("admitted %d, want the whole burst of 100", admitted)
	}
}

// TestSharedInstanceIDNeverOverAdmits: two clients configured with the
// same instance id report on one key through two replicas of one region.
// Neither may be answered with the other's grant: admitted stays within
// b + r·t on Redis time.
func TestSharedInstanceIDNeverOverAdmits(t *testing.T) {
	cfg := regiontest.MustConfig(t, `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  read: {mode: lease, on_failure: closed}
tiers:
  free: {read: {rate: 1/h, burst: 100}}
default_tier: free
`)
	rs := redistest.Start(t)
	regs := []*regiontest.Region{regiontest.StartOn(t, rs, cfg, "local"), regiontest.StartOn(t, rs, cfg, "local")}
	start := regs[0].RedisNow(t)
	var admitted atomic.Int64
	var clients []*lease.Client
	for i := range 2 {
		c, err := lease.NewClient(regs[i].Dial(t), lease.Options{InstanceID: "shared", Refresh: 200 * time.Millisecond,
			BreakerTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	// Both hammer the key over several refreshes.
	var wg sync.WaitGroup
	for _, c := range clients {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 150 {
					d, err := c.Allow(context.Background(), acmeRead, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed && !d.Degraded {
						admitted.Add(1)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	for _, c := range clients {
		c.Close(context.Background())
	}
	elapsed := regs[0].RedisNow(t).Sub(start)
	if bound := 100 + elapsed.Hours(); float64(admitted.Load()) > bound {
		t.Fatalf("two clients sharing an instance id admitted %d; b + r·t = %.3f", admitted.Load(), bound)
	}
	t.Logf("admitted %d; ids now %s, %s", admitted.Load(), clients[0].InstanceID(), clients[1].InstanceID())
}
