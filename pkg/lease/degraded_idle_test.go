package lease_test

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

const degradedOver = "degraded mode over"

// TestDegradedModeOutlivesIdleKeysUntilTheRegionAnswers: the region's
// Redis stops, a key is decided by its on_failure policy, then sees no
// demand and is forgotten as idle. Degraded mode goes on (the gauge stays
// 1, nothing logs its end): forgetting a key says nothing of the region.
// It ends when the region answers a call again, after Redis is back, and
// re-entering it for a key forgotten meanwhile is the same episode.
func TestDegradedModeOutlivesIdleKeysUntilTheRegionAnswers(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	const idle = 3 * time.Second
	// Redis is stopped and restarted outside the bubble: its helpers'
	// goroutines must not join the bubble. Channels made outside it.
	stop, restart, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		<-stop
		e.reg.Redis.Stop()
		done <- struct{}{}
		<-restart
		e.reg.Redis.Restart()
		done <- struct{}{}
	}()
	synctest.Test(t, func(t *testing.T) {
		c, reg, logs := bubbleClient(t, conn, func(o *lease.Options) { o.IdleTimeout = idle })
		stop <- struct{}{}
		<-done
		for i := range 20 {
			if d := mustAllow(t, c, acmeRead, 1); !d.Degraded {
				t.Fatalf("request %d with Redis down: %+v, want degraded", i, d)
			}
		}
		// Idle for the timeout and two periodic Syncs past it.
		time.Sleep(idle + 2*time.Second)
		synctest.Wait()
		if n := c.Table().Len(); n != 0 {
			t.Fatalf("%d keys held after idling out, want the degraded key forgotten", n)
		}
		if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 1 {
			t.Fatalf("degraded gauge %v once the degraded key idled out, region still down; want 1", got)
		}
		// The region answers, saying its Redis fails: the log says so, not
		// that the region is unreachable.
		if s := logs.String(); strings.Contains(s, degradedOver) || !strings.Contains(s, `level=WARN msg="lease: regional service answers that its Redis fails`) ||
			strings.Contains(s, "unreachable") {
			t.Fatalf("log with the region's Redis down and the key idled out:\n%s", s)
		}
		// Still down: the next request is degraded again, in the same episode.
		time.Sleep(time.Second) // the breaker's cooldown: it probes the region
		if d := mustAllow(t, c, acmeRead, 1); !d.Degraded {
			t.Fatalf("request after idling, Redis down: %+v, want degraded", d)
		}
		restart <- struct{}{}
		<-done
		time.Sleep(time.Second)
		if d := mustAllow(t, c, acmeRead, 1); d.Degraded || !d.Allowed {
			t.Fatalf("request with Redis back: %+v, want a leased allow", d)
		}
		synctest.Wait()
		if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 0 {
			t.Fatalf("degraded gauge %v after the region answered", got)
		}
		if s := logs.String(); strings.Count(s, degradedOver) != 1 {
			t.Fatalf("want one end of degraded mode in the log:\n%s", s)
		}
		if got := metrictest.Series(t, reg, "sluice_client_degraded_episodes_total", nil); got != 1 {
			t.Fatalf("degraded episodes %v, want 1", got)
		}
		closeClient(t, c)
	})
}

// TestNoRegionIsNeverDeclaredAnswering: a client whose region address has
// nothing listening decides every request by its policy; when its keys
// idle out, it stays degraded and never logs that the region answers.
// (A real gRPC connection to a closed port; no fault injected.)
func TestNoRegionIsNeverDeclaredAnswering(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	reg := prometheus.NewRegistry()
	logs := &logtest.Buffer{}
	const refresh, idle = 100 * time.Millisecond, 300 * time.Millisecond
	c, err := lease.NewClient(regiontest.Dial(t, addr), lease.Options{
		InstanceID: "nowhere", Refresh: refresh, IdleTimeout: idle, Registerer: reg,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeClient(t, c) })
	for i := range 20 {
		if d := mustAllow(t, c, acmeRead, 1); !d.Degraded {
			t.Fatalf("request %d with no region: %+v, want degraded", i, d)
		}
	}
	waitFor(t, "the degraded key to idle out", func() bool { return c.Table().Len() == 0 })
	// The owner loop notes the end of degraded mode right after the Sync
	// round that forgot the key; give it two more rounds.
	deadline := time.Now().Add(2 * refresh)
	for time.Now().Before(deadline) {
		if strings.Contains(logs.String(), degradedOver) {
			break
		}
		time.Sleep(refresh / 10)
	}
	if s := logs.String(); strings.Contains(s, degradedOver) || strings.Contains(s, "answering again") {
		t.Fatalf("no region exists, yet the log says it answers:\n%s", s)
	}
	if got := metrictest.Gauge(t, reg, "sluice_client_degraded"); got != 1 {
		t.Fatalf("degraded gauge %v with no region and no key active, want 1", got)
	}
}

// TestLateAnswerIsLoggedAsSlowNotUnreachable: a request whose wait ended
// before the region answered is decided by its policy, and the log says
// the region was slow to answer, at info; only once the breaker opens
// (consecutive calls unanswered for their whole call timeout: a hung
// region) does it say unreachable, at warn.
func TestLateAnswerIsLoggedAsSlowNotUnreachable(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, logs := bubbleClient(t, conn, func(o *lease.Options) {
			o.Refresh = time.Hour // no background Sync: the requests alone
			o.BreakerFailures = 3
		})
		conn.setFault("*", hanging)
		if d := mustAllow(t, c, acmeRead, 1); !d.Degraded {
			t.Fatalf("request with no answer in time: %+v, want degraded", d)
		}
		s := logs.String()
		if !strings.Contains(s, `level=INFO msg="lease: regional service slow to answer`) || strings.Contains(s, "unreachable") {
			t.Fatalf("one late answer, breaker closed: want the slow line at info only:\n%s", s)
		}
		for _, k := range []quota.Key{smallRead, {Tenant: "third", Class: "read"}} {
			mustAllow(t, c, k, 1)
		}
		if s := logs.String(); strings.Contains(s, "unreachable") {
			t.Fatalf("three calls still within their call timeout: want no unreachable line:\n%s", s)
		}
		// The calls end unanswered 200ms after they went out: the third
		// opens the breaker, and the next decision says so.
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		mustAllow(t, c, acmeRead, 1)
		if s := logs.String(); !strings.Contains(s, `level=WARN msg="lease: regional service unreachable`) {
			t.Fatalf("three calls unanswered, breaker open: want the unreachable line at warn:\n%s", s)
		}
		conn.setFault("*", healthy)
		closeClient(t, c)
	})
}

// TestSlowEpisodesAreLoggedOnceAMinute: a region that answers late now and
// then (one replica of two hung) starts a slow episode at each late
// answer; the first is logged at info with its end, the others within a
// minute of it go to debug, and the next one logged at info counts them.
func TestSlowEpisodesAreLoggedOnceAMinute(t *testing.T) {
	e := startRegion(t)
	conn := newRegionConn(t, e.reg.Server)
	synctest.Test(t, func(t *testing.T) {
		c, _, logs := bubbleClient(t, conn, func(o *lease.Options) {
			o.Refresh = time.Hour // no background Sync: the requests alone
		})
		const (
			slow = `level=INFO msg="lease: regional service slow to answer`
			over = `level=INFO msg="lease: regional service answering again`
		)
		// episode is one late answer and the answer that ends it, on a
		// key of its own (the degraded key is answered again).
		episode := func(i int) {
			t.Helper()
			k := quota.Key{Tenant: fmt.Sprintf("late%d", i), Class: "read"}
			conn.setFault("*", hanging)
			if d := mustAllow(t, c, k, 1); !d.Degraded {
				t.Fatalf("episode %d: a request with no answer in time: %+v, want degraded", i, d)
			}
			conn.setFault("*", healthy)
			time.Sleep(250 * time.Millisecond) // the hung call's end (four waits), then an answer
			synctest.Wait()
			if d := mustAllow(t, c, k, 1); d.Degraded {
				t.Fatalf("episode %d: the region answering again: %+v, want leased", i, d)
			}
		}
		for i := range 3 {
			episode(i)
		}
		if s := logs.String(); strings.Count(s, slow) != 1 || strings.Count(s, over) != 1 {
			t.Fatalf("three slow episodes within a minute: want the first's start and end at info only:\n%s", s)
		}
		time.Sleep(time.Minute)
		episode(3)
		s := logs.String()
		if strings.Count(s, slow) != 2 || strings.Count(s, over) != 2 || !strings.Contains(s, "slow_episodes_since_last_logged=2") {
			t.Fatalf("a slow episode a minute later: want it at info, counting the 2 at debug:\n%s", s)
		}
		closeClient(t, c)
	})
}
