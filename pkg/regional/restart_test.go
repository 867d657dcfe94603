package regional_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// lease_ttl (1s) well below grant_validity (5s).
const shortLeases = `
epoch: 1s
grant_validity: 5s
lease_ttl: 1s
refresh: 200ms
regions: {local: {weight: 1}}
classes:
  export: {mode: strict, on_failure: closed}
tiers:
  free: {export: {rate: 50/s, burst: 20}}
default_tier: free
`

// TestRestartWaitsOutGrantValidity: Redis lost its data 2 s ago (longer
// than one lease TTL, shorter than one grant validity). The lost bucket may
// have held a grant below the region's static share whose capacity another
// region still uses, so a bucket created now must not start with tokens
// refilled since born + lease TTL: it waits max(lease TTL, grant validity
// + one epoch) from born.
func TestRestartWaitsOutGrantValidity(t *testing.T) {
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, shortLeases)
	ctx := context.Background()
	bornAt := func(ago time.Duration) *regional.RestartGuard {
		reg := regiontest.StartOn(t, rs, cfg, "local")
		now := reg.RedisNow(t)
		if err := reg.RDB.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		born := now.Add(-ago).UnixMicro()
		if err := reg.RDB.Set(ctx, luascripts.DefaultPrefix+"born", strconv.FormatInt(born, 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
		g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartConservative, nil)
		if err := g.Check(ctx, reg.RDB); err != nil {
			t.Fatal(err)
		}
		return g
	}
	check := func(g *regional.RestartGuard) bool {
		reg := regiontest.StartOn(t, rs, cfg, "local", func(o *regional.Options) { o.Guard = g })
		resp, err := sluicev1.NewLeaseServiceClient(reg.Dial(t)).Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAllowed()
	}
	if check(bornAt(2 * time.Second)) {
		t.Fatalf("2s after a data loss (lease TTL 1s, grant validity 5s) a new bucket admitted: it was credited refill since born + lease TTL")
	}
	if !check(bornAt(7 * time.Second)) {
		t.Fatalf("7s after a data loss (past grant validity + one epoch) a new bucket admitted nothing")
	}
}

// TestRestartNewBucketEarnsNothingDuringTheWait: a bucket created inside
// the wait after a Redis data loss starts empty and earns nothing until
// the wait ends (born + max(lease TTL, grant validity + one epoch)), then
// refills at the static rate: over [restart, restart + wait + t] it admits
// at most static rate × t, every instant measured on Redis time. (The
// scripts once refilled such a bucket from its creation.)
func TestRestartNewBucketEarnsNothingDuringTheWait(t *testing.T) {
	// Mostly waits out a restart wait on a Redis of its own (its margin
	// grows when it was starved past it): it runs beside the package's
	// other parallel tests.
	t.Parallel()
	rs := redistest.Start(t)
	cfg := regiontest.MustConfig(t, shortLeases)
	ctx := context.Background()
	wait := max(time.Duration(cfg.LeaseTTL), time.Duration(cfg.GrantValidity)+time.Duration(cfg.Epoch))
	const rate = 50.0 // the only region's static rate
	// margin is how long the wait still runs when the bucket is created;
	// doubled when the test was starved past all of it before its first
	// check.
	for margin := time.Second; ; margin *= 2 {
		setup := regiontest.StartOn(t, rs, cfg, "local")
		now := setup.RedisNow(t)
		if err := setup.RDB.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		born := now.Add(margin - wait)
		if err := setup.RDB.Set(ctx, luascripts.DefaultPrefix+"born", strconv.FormatInt(born.UnixMicro(), 10), 0).Err(); err != nil {
			t.Fatal(err)
		}
		g := regional.NewRestartGuard(luascripts.DefaultPrefix, regional.ColdStartConservative, nil)
		if err := g.Check(ctx, setup.RDB); err != nil {
			t.Fatal(err)
		}
		reg := regiontest.StartOn(t, rs, cfg, "local", func(o *regional.Options) { o.Guard = g })
		lc := sluicev1.NewLeaseServiceClient(reg.Dial(t))
		warmEnd := born.Add(wait)
		end := warmEnd.Add(500 * time.Millisecond)
		var during, admitted int
		var last time.Time
		for last.Before(end) {
			resp, err := lc.Check(ctx, &sluicev1.CheckRequest{Key: qk("acme", "export"), Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			last = reg.RedisNow(t) // the check ran before this instant
			if last.Before(warmEnd) {
				during++
				if resp.GetAllowed() {
					t.Fatalf("a bucket created %v before the end of the restart wait admitted %v before it ended",
						margin, warmEnd.Sub(last))
				}
				if ra := time.Duration(resp.GetRetryAfterMs()) * time.Millisecond; ra < warmEnd.Sub(last) {
					t.Fatalf("denied %v before the end of the restart wait with Retry-After %v", warmEnd.Sub(last), ra)
				}
			}
			if resp.GetAllowed() {
				admitted++
			}
		}
		if during == 0 {
			if margin >= 16*time.Second {
				t.Fatalf("starved past a %v margin: no check ran inside the restart wait", margin)
			}
			continue
		}
		after := last.Sub(warmEnd)
		if bound := int(rate * after.Seconds()); admitted > bound {
			t.Fatalf("admitted %d over [restart, restart + wait + %v], more than the static rate allows after the wait: %d",
				admitted, after, bound)
		}
		if admitted == 0 {
			t.Fatalf("nothing admitted in the %v after the restart wait", after)
		}
		return
	}
}

// restartUnderLeases: a key of 20/s, burst 40 in one region (its static
// share is the whole limit); the class fails closed, so every admission is
// one the region backed, and expired leases are forfeited, so no crash
// error ε enters the bound (an instance starved past its lease TTL is a
// crash to the region). The restart wait is max(lease TTL 2s, grant
// validity 5s + epoch 1s) = 6s.
const restartUnderLeases = `
epoch: 1s
grant_validity: 5s
lease_ttl: 2s
refresh: 500ms
regions: {local: {weight: 1}}
classes:
  closed: {mode: lease, on_failure: closed, reclaim: none}
tiers:
  free: {closed: {rate: 20/s, burst: 40}}
default_tier: free
`

// admission is one admitted token: its decision ran between from and to.
type admission struct{ from, to time.Time }

// closedLoad is three lease clients (instances i-0 to i-2) of one region
// asking for one key whose class fails closed, each as fast as it is
// admitted and 2 ms after a denial (as a caller answering 429 would),
// recording every admission.
type closedLoad struct {
	mu       sync.Mutex
	admitted []admission // guarded by mu
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startClosedLoad(t *testing.T, reg *regiontest.Region, key quota.Key) *closedLoad {
	t.Helper()
	l := &closedLoad{stop: make(chan struct{})}
	for i := range 3 {
		// The class fails closed from the first request on, before the
		// region has described the key.
		c := newClient(t, reg, fmt.Sprintf("i-%d", i), lease.Options{
			Classes: map[string]lease.ClassPolicy{"closed": {Mode: lease.ModeLease, OnFailure: lease.PolicyClosed}},
		})
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				from := time.Now()
				dec, err := c.Allow(context.Background(), key, 1)
				if err != nil {
					t.Errorf("allow: %v", err)
					return
				}
				if dec.Allowed && dec.Degraded {
					t.Errorf("a class failing closed admitted a degraded decision")
				}
				if dec.Allowed {
					to := time.Now()
					l.mu.Lock()
					l.admitted = append(l.admitted, admission{from, to})
					l.mu.Unlock()
					continue
				}
				select {
				case <-l.stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
		}()
	}
	return l
}

func (l *closedLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.admitted)
}

// waitFor waits until n admissions in all, within 20 s.
func (l *closedLoad) waitFor(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for l.count() < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d admitted in 20s", l.count(), n)
		}
		time.Sleep(5 * time.Millisecond) // polling the load's progress with a deadline
	}
}

// finish stops the clients' loops and returns every admission.
func (l *closedLoad) finish() []admission {
	close(l.stop)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.admitted
}

// admittedAfter counts the admissions decided wholly after at.
func admittedAfter(admitted []admission, at time.Time) int {
	n := 0
	for _, a := range admitted {
		if a.from.After(at) {
			n++
		}
	}
	return n
}

// worstExcess is the most a stream of admissions certainly exceeds b + r·t
// over some interval: for every pair of admissions, the ones whose
// decision ran wholly within [from_i, to_j] were admitted within that
// interval, whatever the scheduling delays around each call, so
// count − b − r·(to_j − from_i) is a real excess when positive.
func worstExcess(adm []admission, r, b float64) float64 {
	worst := math.Inf(-1)
	for _, i := range adm {
		for _, j := range adm {
			if j.to.Before(i.from) {
				continue
			}
			n := 0
			for _, k := range adm {
				if !k.from.Before(i.from) && !k.to.After(j.to) {
					n++
				}
			}
			if e := float64(n) - b - r*j.to.Sub(i.from).Seconds(); e > worst {
				worst = e
			}
		}
	}
	return worst
}

// TestRedisRestartedEmptyUnderLeasesHandsOutNoBurst: a real regional
// daemon and real redis-server; three instances spend one key flat out
// and hold leases on it; Redis is killed and restarted empty on the same
// address. The buckets the scripts create in the new data set must start
// empty (the scripts read and write the data set's born sentinel in the
// same call; a caller's earlier reading of it counts for nothing), so over
// every interval the instances admit at most b + r·t: the tokens they
// still hold were debited before the restart, and nothing is handed out
// again. Under -cold-start full as well: a Redis that loses its data while
// the process runs is never trusted to start full. (The sentinel was once
// read by the process on each new connection and passed to the scripts,
// so the first calls after the restart, planned with the old birth,
// recreated the bucket full: a whole burst more.)
func TestRedisRestartedEmptyUnderLeasesHandsOutNoBurst(t *testing.T) {
	// Mostly waits out lease TTLs and a restart of its own Redis: it runs
	// beside the package's other parallel tests, and so do its two cases.
	t.Parallel()
	for _, mode := range []regional.ColdStart{regional.ColdStartConservative, regional.ColdStartFull} {
		t.Run(map[regional.ColdStart]string{regional.ColdStartConservative: "conservative", regional.ColdStartFull: "full"}[mode], func(t *testing.T) {
			t.Parallel()
			rs := redistest.Start(t)
			cfg := regiontest.MustConfig(t, restartUnderLeases)
			// A Redis in service long before the test: its data set is old
			// (trusted full), so the load starts on a full bucket.
			if err := rs.Client().Set(context.Background(), luascripts.DefaultPrefix+"born", "0", 0).Err(); err != nil {
				t.Fatal(err)
			}
			d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
				Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: rs.Addr(),
				Config: regional.StaticConfig{C: cfg}, ColdStart: mode, Unleased: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(d.Stop)
			reg := &regiontest.Region{Addr: d.GRPCAddr()}
			key := quota.Key{Tenant: "acme", Class: "closed"}
			const r, b = 20.0, 40.0

			load := startClosedLoad(t, reg, key)
			// Saturate: the burst is gone and the instances hold leases.
			load.waitFor(t, int(b)+10)
			rs.Restart()
			restarted := time.Now()
			// Run on for one lease TTL after the restart: every lease
			// issued before it has ended by then, so all the instances
			// held was spent or dropped.
			<-time.After(time.Duration(cfg.LeaseTTL) + 500*time.Millisecond)
			admitted := load.finish()
			excess := worstExcess(admitted, r, b)
			t.Logf("admitted %d, %d after the restart; worst interval exceeds b + r·t by %.1f tokens", len(admitted), admittedAfter(admitted, restarted), excess)
			if excess > 0 {
				t.Fatalf("over some interval the instances admitted %.1f tokens more than b + r·t: the empty Redis handed out a burst", excess)
			}
			// Counted as a loss, not as a rollback: the sentinel went with
			// the data.
			if losses, rollbacks := awaitDataLoss(t, d, cfg, 0); losses != 1 || rollbacks != 0 {
				t.Errorf("sluice_regional_redis_data_losses_total = %v, sluice_regional_redis_rollbacks_total = %v after an empty restart, want 1 and 0", losses, rollbacks)
			}
		})
	}
}
