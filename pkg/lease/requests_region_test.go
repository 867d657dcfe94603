package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// halfRegion: two regions of equal weight, only "local" running, so a
// read key's burst of 20 gives local a cap of 10 (its static share; also
// its floor, partition_share 1, while a region with a global tier has no
// static lease).
const halfRegion = `
lease_ttl: 2s
refresh: 200ms
regions: {local: {weight: 1}, far: {weight: 1}}
classes: {read: {mode: lease, partition_share: 1}}
tiers: {free: {read: {rate: 1/s, burst: 20}}}
default_tier: free
`

// TestRequestAboveTheCapLeavesSmallerOnesTheirTokens: a request costing
// more than the region's cap (but no more than the key's burst) is denied
// with a wait until the client asks the region again where the region has
// a global tier (its cap grows when the global tier grants it more of the
// burst), with RetryNever where it has none (unleased: its cap is its
// static share for good), and either way the requests after it that need
// less are decided by what the region holds, not turned away on the
// strength of an answer about 20 tokens.
func TestRequestAboveTheCapLeavesSmallerOnesTheirTokens(t *testing.T) {
	for _, tc := range []struct {
		name      string
		opts      []regiontest.Option
		wantNever bool
	}{
		{name: "with a global tier", opts: []regiontest.Option{leased}},
		{name: "unleased", wantNever: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := regiontest.MustConfig(t, halfRegion)
			e := env{reg: regiontest.Start(t, cfg, "local", tc.opts...), cfg: cfg}
			c, _, _ := newClient(t, e)
			key := quota.Key{Tenant: "acme", Class: "read"}
			d := mustAllow(t, c, key, 20)
			switch {
			case d.Allowed:
				t.Fatalf("cost 20 against a cap of 10 and a burst of 20: %+v, want denied", d)
			case tc.wantNever && (!d.RetryNever || d.RetryAfter != 0):
				t.Fatalf("cost 20 against an unleased region's cap of 10 and a burst of 20: %+v, want RetryNever, no RetryAfter", d)
			case !tc.wantNever && (d.RetryNever || d.RetryAfter <= 0 || d.RetryAfter > c.Table().Options().Refresh):
				t.Fatalf("cost 20 against a cap of 10 and a burst of 20: %+v, want a RetryAfter of at most the refresh, no RetryNever", d)
			}
			for i := range 10 {
				if d := mustAllow(t, c, key, 1); !d.Allowed || d.Degraded {
					t.Fatalf("cost 1, request %d, the region's bucket holding 10 tokens: %+v, want allowed", i, d)
				}
			}
		})
	}
}

// TestReleaseIsSplitIntoCallsTheRegionAccepts: a client holding more keys
// than one call may carry (a region refuses a Release of more reports
// than its bound, docs/operations.md "Request bounds") returns them in
// several Release calls of at most 500 reports each, and the region gets
// every key back.
func TestReleaseIsSplitIntoCallsTheRegionAccepts(t *testing.T) {
	// Leases outlast the test: what is checked is the Release of live
	// leases. With the usual 2 s TTL a starved machine took longer than
	// that from the last key's acquire to its Release (three calls of
	// up to 500 reports), the region had reaped the lease meanwhile and,
	// rightly, booked nothing for a Release of a lease it no longer
	// holds.
	cfg := regiontest.MustConfig(t, strings.Replace(oneRegion, "lease_ttl: 2s", "lease_ttl: 1m", 1))
	e := env{reg: regiontest.Start(t, cfg, "local"), cfg: cfg}
	var mu sync.Mutex
	var released []int // reports per Release call, in order
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*sluicev1.ReleaseRequest); ok {
			mu.Lock()
			released = append(released, len(r.GetReports()))
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	conn, err := grpc.NewClient(e.reg.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(count))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, err := lease.NewClient(conn, lease.Options{
		InstanceID: "it-release-split", Refresh: 200 * time.Millisecond, IdleTimeout: time.Minute,
		// Generous: the machine running the tests is shared (see newClient).
		SyncTimeout: 2 * time.Second, BreakerTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	const keys = 1001
	key := func(i int) quota.Key { return quota.Key{Tenant: fmt.Sprintf("t%04d", i), Class: "read"} }
	for i := range keys {
		// A key's first acquire may outlive the 2 s wait on a starved
		// machine, and be decided by its policy: it is asked again, so
		// that every key holds a lease at Close.
		for deadline := time.Now().Add(time.Minute); ; {
			d := mustAllow(t, c, key(i), 1)
			if d.Allowed && !d.Degraded {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("key %d: %+v, want allowed from a lease within a minute", i, d)
			}
			time.Sleep(50 * time.Millisecond) // polling the client with a deadline
		}
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	mu.Lock()
	got := slices.Clone(released)
	mu.Unlock()
	if !slices.Equal(got, []int{500, 500, 1}) {
		t.Fatalf("Release calls carried %v reports, want [500 500 1]", got)
	}
	for _, i := range []int{0, 500, keys - 1} {
		if st := e.regionState(t, key(i)); st.Outstanding != 0 || st.Admitted != 1 {
			t.Errorf("%s after Close: region outstanding %d admitted %d; want 0 and 1", key(i), st.Outstanding, st.Admitted)
		}
	}
}

// TestCallerThatGivesUpIsNotDecided: a request whose context ended before
// the region answered is not decided by the key's on_failure policy (the
// region is healthy; deciding locally would admit beyond the limit for
// every caller that hangs up early): Allow returns an error wrapping
// ErrAbandoned and the context's error, admits nothing and leaves the
// client out of degraded mode. A context already done sends nothing; one
// that ends while the region is silent (a listener that never answers)
// ends the wait.
func TestCallerThatGivesUpIsNotDecided(t *testing.T) {
	e := startRegion(t)
	c, reg, _ := newClient(t, e)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 50 {
		d, err := c.Allow(gone, quota.Key{Tenant: fmt.Sprintf("gone%d", i%5), Class: "read"}, 1)
		if !errors.Is(err, lease.ErrAbandoned) || !errors.Is(err, context.Canceled) || d.Allowed || d.Degraded {
			t.Fatalf("request %d with a cancelled context: %+v, %v; want no decision and an error wrapping ErrAbandoned and context.Canceled", i, d, err)
		}
	}
	// Gone before asking: no request is sent for it.
	if n := rpcCalls(t, reg, "Acquire") + rpcCalls(t, reg, "Check"); n != 0 {
		t.Fatalf("%d Acquire or Check calls for requests whose caller had gone; want 0", n)
	}
	if n := c.Table().DegradedKeys(); n != 0 {
		t.Fatalf("%d keys degraded by callers that gave up; want 0", n)
	}

	silent := silentClient(t, time.Hour)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	d, err := silent.Allow(ctx, acmeRead, 1)
	if !errors.Is(err, lease.ErrAbandoned) || !errors.Is(err, context.DeadlineExceeded) || d.Allowed || d.Degraded {
		t.Fatalf("a caller's deadline before a silent region answers: %+v, %v; want no decision and an error wrapping ErrAbandoned and DeadlineExceeded", d, err)
	}
	if n := silent.Table().DegradedKeys(); n != 0 {
		t.Fatalf("%d keys degraded by a caller's deadline; want 0", n)
	}

	// A strict class's Check is let go the same way, not decided by its
	// on_failure policy (open here, which would admit).
	strict := silentClient(t, time.Hour, func(o *lease.Options) {
		o.Classes = map[string]lease.ClassPolicy{"export": {Mode: lease.ModeStrict, OnFailure: lease.PolicyOpen}}
	})
	checkCtx, cancelCheck := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelCheck()
	d, err = strict.Allow(checkCtx, quota.Key{Tenant: "acme", Class: "export"}, 1)
	if !errors.Is(err, lease.ErrAbandoned) || !errors.Is(err, context.DeadlineExceeded) || d.Allowed || d.Degraded {
		t.Fatalf("a caller's deadline before a silent region answers a strict Check: %+v, %v; want no decision and an error wrapping ErrAbandoned and DeadlineExceeded", d, err)
	}
	if n := strict.Table().DegradedKeys(); n != 0 {
		t.Fatalf("%d strict keys degraded by a caller's deadline; want 0", n)
	}

	// A caller whose deadline ends while its request waits for another
	// request's acquire on the key (in flight to the silent region) is
	// let go too, and the other request keeps waiting for the region.
	waiting := quota.Key{Tenant: "waiting", Class: "read"}
	firstCtx, cancelFirst := context.WithCancel(context.Background())
	defer cancelFirst()
	first := make(chan error, 1)
	go func() { _, err := silent.Allow(firstCtx, waiting, 1); first <- err }()
	waitFor(t, "the first request's acquire to be in flight", func() bool {
		st, ok := silent.Table().State(waiting)
		return ok && st.InFlight
	})
	secondCtx, cancelSecond := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelSecond()
	second := make(chan error, 1)
	go func() { _, err := silent.Allow(secondCtx, waiting, 1); second <- err }()
	var err2 error
	waitFor(t, "the second request to end", func() bool {
		select {
		case err2 = <-second:
			return true
		default:
			return false
		}
	})
	if !errors.Is(err2, lease.ErrAbandoned) || !errors.Is(err2, context.DeadlineExceeded) {
		t.Fatalf("a caller's deadline while waiting for another request's acquire: %v; want an error wrapping ErrAbandoned and DeadlineExceeded", err2)
	}
	select {
	case err := <-first:
		t.Fatalf("the first request ended with the second (%v); want it waiting for the region", err)
	default:
	}
	cancelFirst()
	if err := <-first; !errors.Is(err, lease.ErrAbandoned) || !errors.Is(err, context.Canceled) {
		t.Fatalf("the first request, cancelled: %v; want an error wrapping ErrAbandoned and context.Canceled", err)
	}
}

// silentClient is a lease client of a region that never answers: an
// address that accepts connections and reads nothing. Its breaker timeout
// bounds a request's wait; its background Sync never runs.
func silentClient(t *testing.T, breakerTimeout time.Duration, mod ...func(*lease.Options)) *lease.Client {
	t.Helper()
	conn, err := grpc.NewClient(grpctest.SilentAddr(t, nil), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	o := lease.Options{InstanceID: "it-silent", BreakerTimeout: breakerTimeout, SyncTimeout: time.Hour, Refresh: time.Hour}
	for _, f := range mod {
		f(&o)
	}
	c, err := lease.NewClient(conn, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c.Close(ctx)
	})
	return c
}

// TestCloseSaysItsContextEndedAndRunsOnce: a Close whose ctx ends before
// the region answers returns an error wrapping the context's (the caller
// can tell a deadline from a refusal), and a second Close, called while
// the first waits, waits for it and returns the same result instead of a
// nil that says the tokens went back.
func TestCloseSaysItsContextEndedAndRunsOnce(t *testing.T) {
	c := silentClient(t, 20*time.Millisecond)
	// A request the silent region never answers leaves its report pending:
	// Close must resend it.
	if d, err := c.Allow(context.Background(), acmeRead, 1); err != nil || !d.Degraded {
		t.Fatalf("a request to a silent region: %+v, %v; want a degraded decision", d, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	first := make(chan error, 1)
	go func() { first <- c.Close(ctx) }()
	waitFor(t, "the first Close to begin", func() bool {
		_, err := c.Allow(context.Background(), acmeRead, 1)
		return errors.Is(err, lease.ErrClosed)
	})
	second := c.Close(context.Background())
	err := <-first
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a 200ms deadline against a silent region: %v; want an error wrapping context.DeadlineExceeded", err)
	}
	if second != err {
		t.Fatalf("a Close during the first returned %v; want the first's %v", second, err)
	}
	if again := c.Close(context.Background()); again != err {
		t.Fatalf("a Close after the first returned %v; want the first's %v", again, err)
	}
}

// TestRequestWaitingOnASyncInFlightEndsAtItsOwnTimeout: a request that
// waits for a background Sync carrying its key's report (here one the
// silent region never answers, bounded by the hour-long SyncTimeout) is
// decided by the key's policy once its own breaker timeout has passed,
// not when the Sync ends.
func TestRequestWaitingOnASyncInFlightEndsAtItsOwnTimeout(t *testing.T) {
	c := silentClient(t, 100*time.Millisecond, func(o *lease.Options) { o.Refresh = 50 * time.Millisecond })
	// Unanswered, the first request is decided by the policy and leaves
	// its report pending; the next periodic Sync carries it, and hangs.
	if d, err := c.Allow(context.Background(), acmeRead, 1); err != nil || !d.Degraded {
		t.Fatalf("a request to a silent region: %+v, %v; want a degraded decision", d, err)
	}
	waitFor(t, "a Sync carrying the key's report to be in flight", func() bool {
		st, ok := c.Table().State(acmeRead)
		return ok && st.InFlight
	})
	done := make(chan quota.Decision, 1)
	go func() {
		d, err := c.Allow(context.Background(), acmeRead, 1)
		if err != nil {
			t.Errorf("a request waiting on the Sync: %v", err)
		}
		done <- d
	}()
	var d quota.Decision
	waitFor(t, "the request waiting on the Sync to be decided", func() bool {
		select {
		case d = <-done:
			return true
		default:
			return false
		}
	})
	if !d.Degraded {
		t.Fatalf("a request whose wait on a Sync in flight timed out: %+v; want decided by the policy", d)
	}
}
