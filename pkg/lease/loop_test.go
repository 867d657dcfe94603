package lease_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// bubbleClient starts a client on conn inside the current bubble.
func bubbleClient(t *testing.T, conn *regionConn, mod ...func(*lease.Options)) (*lease.Client, *prometheus.Registry, *logtest.Buffer) {
	t.Helper()
	reg := prometheus.NewRegistry()
	logs := &logtest.Buffer{}
	o := lease.Options{
		InstanceID: "bubble",
		Refresh:    time.Second,
		Registerer: reg,
		Logger:     slog.New(slog.NewTextHandler(logs, nil)),
	}
	for _, f := range mod {
		f(&o)
	}
	c, err := lease.NewClient(conn, o)
	if err != nil {
		t.Fatal(err)
	}
	// Runs inside the bubble, so a failed test still stops the loop.
	t.Cleanup(func() { c.Close(context.Background()) })
	return c, reg, logs
}

func closeClient(t *testing.T, c *lease.Client) {
	t.Helper()
	if err := c.Close(context.Background()); err != nil {
		t.Errorf("Close: %v", err)
	}
}

func reportFor(reports []*sluicev1.KeyReport, key quota.Key) *sluicev1.KeyReport {
	for _, r := range reports {
		if r.Key.Tenant == key.Tenant && r.Key.Class == key.Class {
			return r
		}
	}
	return nil
}

// The background loop sends exactly one Sync per refresh, carrying every
// key the instance holds.
func TestLoopSyncsEveryKeyOncePerRefresh(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	keys := []quota.Key{acmeRead, smallRead, {Tenant: "other", Class: "read"}}
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn)
		start := time.Now()
		for _, k := range keys {
			if d := mustAllow(t, c, k, 1); !d.Allowed {
				t.Fatalf("%s: %+v", k, d)
			}
		}
		synctest.Wait() // early refills after the first acquires
		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		var periodic []time.Duration
		for _, s := range conn.servedCalls("Sync") {
			if s.err != nil {
				t.Fatalf("Sync failed: %v", s.err)
			}
			at := s.at.Sub(start)
			if at <= 100*time.Millisecond {
				// Early refills after the first acquires come at once and
				// then batched one spacing (Refresh/20) apart: one Sync
				// may carry every key's when the first answers were slow
				// to come back from the region, which runs outside the
				// bubble on real time.
				continue
			}
			if len(s.req.(*sluicev1.SyncRequest).Reports) != len(keys) {
				t.Fatalf("partial Sync at %v, after the initial refills", at)
			}
			periodic = append(periodic, at)
		}
		want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second}
		if len(periodic) != len(want) {
			t.Fatalf("full Syncs at %v, want %v", periodic, want)
		}
		for i := range want {
			if periodic[i] != want[i] {
				t.Fatalf("full Syncs at %v, want %v", periodic, want)
			}
		}
		closeClient(t, c)
	})
}

// With the region unreachable, the lease's tokens are spendable up to its
// deadline (send time + ttl) and not at or after it; the expired tokens
// are returned once the region is back.
func TestLoopExpiresLeaseAtDeadline(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn, func(o *lease.Options) { o.IdleTimeout = time.Hour })
		sent := time.Now()
		mustAllow(t, c, acmeRead, 1)
		synctest.Wait()
		conn.setFault("*", unreachable)
		st, _ := c.Table().State(acmeRead)
		if !st.HasLease || st.Tokens == 0 {
			t.Fatalf("no lease held: %+v", st)
		}
		deadline := st.Deadline
		if ttl := 2 * time.Second; deadline.Sub(sent) > ttl || deadline.Sub(sent) < ttl-time.Second {
			t.Fatalf("deadline %v after the first send, want within the last refresh of the 2s ttl", deadline.Sub(sent))
		}
		time.Sleep(time.Until(deadline) - time.Nanosecond)
		if d := mustAllow(t, c, acmeRead, 1); !d.Allowed || d.Degraded {
			t.Fatalf("1ns before the deadline: %+v, want a leased allow", d)
		}
		held, _ := c.Table().State(acmeRead)
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		st, _ = c.Table().State(acmeRead)
		if st.HasLease || st.Tokens != 0 || st.ToReturn < held.Tokens {
			t.Fatalf("at the deadline: %+v; want no lease, empty pool, %d tokens to return", st, held.Tokens)
		}
		if d := mustAllow(t, c, acmeRead, 1); !d.Degraded {
			t.Fatalf("after the deadline with the region down: %+v, want degraded", d)
		}

		conn.setFault("*", healthy)
		time.Sleep(time.Second)
		synctest.Wait()
		syncs := conn.servedCalls("Sync")
		r := reportFor(syncs[len(syncs)-1].req.(*sluicev1.SyncRequest).Reports, acmeRead)
		if r == nil || r.Returned < held.Tokens {
			t.Fatalf("first Sync after recovery: %v; want the %d expired tokens returned", r, held.Tokens)
		}
		closeClient(t, c)
	})
}

// A Sync that failed is resent with the same report; usage made meanwhile
// goes into the next seq.
func TestLoopResendsFailedSyncUnchanged(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn)
		mustAllow(t, c, acmeRead, 1)
		synctest.Wait()
		for i := 0; i < 3; i++ {
			mustAllow(t, c, acmeRead, 1)
		}
		conn.setFault("Sync", hanging) // the region may or may not apply it; the client cannot tell
		time.Sleep(time.Second)
		synctest.Wait()
		lost, _ := c.Table().State(acmeRead)
		if lost.Pending == nil {
			t.Fatal("no pending report after a failed Sync")
		}
		sent := proto.Clone(lost.Pending).(*sluicev1.KeyReport)
		before := len(conn.servedCalls("Sync"))
		mustAllow(t, c, acmeRead, 1)
		conn.setFault("Sync", healthy)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		// The next two reports for the key to reach the region (an early
		// refill or the periodic Sync): the lost one verbatim, then a new
		// seq with the token used meanwhile.
		var got []*sluicev1.KeyReport
		for _, s := range conn.servedCalls("Sync")[before:] {
			if r := reportFor(s.req.(*sluicev1.SyncRequest).Reports, acmeRead); r != nil {
				got = append(got, r)
			}
		}
		if len(got) < 2 {
			t.Fatalf("%d reports for the key after recovery, want at least 2", len(got))
		}
		if !proto.Equal(got[0], sent) {
			t.Fatalf("resent %v, want unchanged %v", got[0], sent)
		}
		if got[1].Seq <= sent.Seq || got[1].Used != sent.Used+1 {
			t.Fatalf("next report %v; want a higher seq whose total adds the 1 token used meanwhile", got[1])
		}
		closeClient(t, c)
		if st := e.regionState(t, acmeRead); st.Admitted != 5 {
			t.Fatalf("region counted %d tokens used, want 5: retries must not double count", st.Admitted)
		}
	})
}

// The breaker opens after BreakerFailures calls the region left
// unanswered for their whole call timeout (four request timeouts: 200ms),
// skips the region for the cooldown (decisions come at once from the
// policy), then lets one probe through; a successful probe resumes
// leasing. Each request gives up on its call after the 50ms breaker
// timeout and is decided by its policy, but the call goes on: one
// answered late would land.
func TestBreakerOpensAndProbes(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, reg, logs := bubbleClient(t, conn, func(o *lease.Options) {
			o.Refresh = time.Hour // keep the background Sync out of the way
			o.BreakerFailures = 3
			o.BreakerCooldown = time.Second
		})
		conn.setFault("*", hanging)
		// Three keys: a request on a key whose call is still out waits for
		// that call instead of sending another.
		keys := []quota.Key{acmeRead, smallRead, {Tenant: "third", Class: "read"}}
		for i, k := range keys {
			start := time.Now()
			d := mustAllow(t, c, k, 1)
			if !d.Degraded || time.Since(start) != 50*time.Millisecond {
				t.Fatalf("request %d: %+v after %v; want degraded after the 50ms breaker timeout", i, d, time.Since(start))
			}
		}
		if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 1 {
			t.Fatalf("degraded gauge %v", got)
		}
		// The calls sent at 0, 50 and 100ms end unanswered at 200, 250 and
		// 300ms; the third opens the breaker.
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		start := time.Now()
		if d := mustAllow(t, c, acmeRead, 1); !d.Degraded || time.Since(start) != 0 {
			t.Fatalf("open breaker: %+v after %v; want an immediate degraded decision", d, time.Since(start))
		}
		if n := conn.attemptCount("Acquire"); n != 3 {
			t.Fatalf("%d Acquire attempts, want 3 (none while open)", n)
		}
		conn.setFault("*", healthy)
		time.Sleep(time.Second - 50*time.Millisecond)
		if d := mustAllow(t, c, acmeRead, 1); !d.Degraded || conn.attemptCount("Acquire") != 3 {
			t.Fatalf("before the cooldown ended: %+v", d)
		}
		time.Sleep(50 * time.Millisecond)
		if d := mustAllow(t, c, acmeRead, 1); !d.Allowed || d.Degraded {
			t.Fatalf("probe after the cooldown: %+v, want a leased allow", d)
		}
		// The other keys decided by their policy are answered again.
		for _, k := range keys[1:] {
			if d := mustAllow(t, c, k, 1); !d.Allowed || d.Degraded {
				t.Fatalf("%s after the probe: %+v, want a leased allow", k, d)
			}
		}
		synctest.Wait()
		if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 0 {
			t.Fatalf("degraded gauge %v after recovery", got)
		}
		if s := logs.String(); !strings.Contains(s, "degraded mode)") || !strings.Contains(s, "degraded mode over") {
			t.Fatalf("missing degraded transitions in the log:\n%s", s)
		}
		closeClient(t, c)
	})
}

// The background Sync ends degraded mode without any request.
func TestBackgroundSyncEndsDegradedMode(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, reg, _ := bubbleClient(t, conn)
		conn.setFault("*", unreachable)
		if d := mustAllow(t, c, smallRead, 1); !d.Degraded || !d.Allowed || d.Limit != 10 {
			// FallbackLimit default: 10/s burst 10.
			t.Fatalf("first request with the region down: %+v", d)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 1 {
			t.Fatalf("degraded gauge %v while the region is down", got)
		}
		conn.setFault("*", healthy)
		time.Sleep(time.Second)
		synctest.Wait()
		if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 0 {
			t.Fatalf("degraded gauge %v after a successful Sync", got)
		}
		if st, _ := c.Table().State(smallRead); !st.HasLease || st.Tokens == 0 {
			t.Fatalf("no lease after recovery: %+v", st)
		}
		closeClient(t, c)
	})
}

// A key unused for IdleTimeout is released and forgotten.
func TestIdleKeyReleased(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn, func(o *lease.Options) { o.IdleTimeout = 3 * time.Second })
		mustAllow(t, c, acmeRead, 1)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		rel := conn.servedCalls("Release")
		if len(rel) != 1 || c.Table().Len() != 0 {
			t.Fatalf("%d Releases, %d keys left; want the idle key released", len(rel), c.Table().Len())
		}
		r := rel[0].req.(*sluicev1.ReleaseRequest).Reports[0]
		if r.Want != 0 || r.Returned == 0 {
			t.Fatalf("release report %v; want want=0 and the unspent tokens returned", r)
		}
		if st := e.regionState(t, acmeRead); st.Outstanding != 0 || st.Admitted != 1 {
			t.Fatalf("region: outstanding %d admitted %d; want 0 and 1", st.Outstanding, st.Admitted)
		}
		closeClient(t, c)
	})
}

// A request that finds a refill in flight waits for it instead of sending
// its own acquire.
func TestRequestsShareARefillInFlight(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, _ := bubbleClient(t, conn)
		results := make(chan quota.Decision, 8)
		for i := 0; i < 8; i++ {
			go func() {
				d, err := c.Allow(context.Background(), acmeRead, 1)
				if err != nil {
					t.Error(err)
				}
				results <- d
			}()
		}
		for i := 0; i < 8; i++ {
			if d := <-results; !d.Allowed || d.Degraded {
				t.Fatalf("decision %+v", d)
			}
		}
		if n := conn.attemptCount("Acquire"); n > 4 {
			t.Fatalf("%d Acquires for 8 concurrent first requests; they should share refills", n)
		}
		closeClient(t, c)
	})
}
