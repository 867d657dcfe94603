package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// deliverConfig: three regions of equal weight, one key of 1000/s with a
// burst of 1000, the production defaults for every period. The class is
// closed, so nothing is admitted outside the leases (no degraded local
// decisions) and every admission counts against b + r·t.
const deliverConfig = `
regions:
  us-east:  {weight: 1}
  eu-west:  {weight: 1}
  ap-south: {weight: 1}
classes:
  write: {mode: lease, on_failure: closed}
tiers:
  std: {write: {rate: 1000/s, burst: 1000}}
default_tier: std
`

// deliverRegions in the order of the offered split.
var deliverRegions = []string{"us-east", "eu-west", "ap-south"}

// offeredLoad is an open-loop load: requests go out on a fixed schedule,
// whatever the answers, as users' requests do.
type offeredLoad struct {
	t       *testing.T
	key     quota.Key
	start   time.Time
	phases  []loadPhase
	clients map[string]*lease.Client

	mu      sync.Mutex // guards records
	records []attempt

	total    atomic.Int64 // admitted so far, all regions
	degraded atomic.Int64 // decisions by the on_failure policy
	stop     chan struct{}
	wg       sync.WaitGroup
}

// loadPhase offers rates[i] requests/s in deliverRegions[i] for length.
type loadPhase struct {
	length time.Duration
	rates  []float64
}

// attempt is one offered request: when it was due and when it was
// decided (since start), and whether it was admitted.
type attempt struct {
	at, decided time.Duration
	region      int
	allowed     bool
}

func (l *offeredLoad) length() time.Duration {
	var d time.Duration
	for _, p := range l.phases {
		d += p.length
	}
	return d
}

// due is how many requests region i has been offered by since.
func (l *offeredLoad) due(i int, since time.Duration) int64 {
	var n float64
	var off time.Duration
	for _, p := range l.phases {
		if since <= off {
			break
		}
		n += p.rates[i] * (min(since, off+p.length) - off).Seconds()
		off += p.length
	}
	return int64(math.Floor(n))
}

// dueAt is when region i's n-th request (from 0) is due.
func (l *offeredLoad) dueAt(i int, n int64) time.Duration {
	var before float64
	var off time.Duration
	for _, p := range l.phases {
		in := p.rates[i] * p.length.Seconds()
		if float64(n) < before+in && p.rates[i] > 0 {
			return off + time.Duration((float64(n)-before)/p.rates[i]*float64(time.Second))
		}
		before += in
		off += p.length
	}
	return off
}

func (l *offeredLoad) run() {
	for i, region := range deliverRegions {
		jobs := make(chan time.Duration, 1<<16)
		cl := l.clients[region]
		// Workers: a request waiting on the region (a synchronous acquire)
		// must not hold back the ones due after it, nor keep the demand
		// the instance measures (and reports) below what is offered.
		for range 32 {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				for at := range jobs {
					d, err := cl.Allow(context.Background(), l.key, 1)
					if err != nil {
						l.t.Errorf("%s: allow: %v", region, err)
						continue
					}
					if d.Allowed {
						l.total.Add(1)
					}
					if d.Degraded {
						l.degraded.Add(1)
					}
					l.mu.Lock()
					l.records = append(l.records, attempt{at: at, decided: time.Since(l.start), region: i, allowed: d.Allowed})
					l.mu.Unlock()
				}
			}()
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer close(jobs)
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			var sent int64
			for {
				select {
				case <-l.stop:
					return
				case <-tick.C:
				}
				since := time.Since(l.start)
				if since >= l.length() {
					return
				}
				for due := l.due(i, since); sent < due; sent++ {
					jobs <- l.dueAt(i, sent)
				}
			}
		}()
	}
}

// idealCentral is what one central token bucket (rate r, burst b, full
// at the start) admits of the attempts, in the order they were due.
func idealCentral(attempts []attempt, r, b float64) []bool {
	ok := make([]bool, len(attempts))
	tokens, last := b, time.Duration(0)
	for i, a := range attempts {
		tokens = min(b, tokens+r*(a.at-last).Seconds())
		last = a.at
		if tokens >= 1 {
			tokens--
			ok[i] = true
		}
	}
	return ok
}

// redisTime is the Redis clock of region's first replica.
func redisTime(t *testing.T, c *devcluster.Cluster, region string) time.Time {
	t.Helper()
	now, err := c.Regions[region].Replicas[0].Daemon().Redis.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// TestDeliverTheLimitThroughShifts: three regions of equal weight share a
// key of 1000/s, burst 1000. 1500 requests/s are offered, 70/20/10 across
// the regions, then 10/20/70. The fleet admits at most b + r·t at every
// checkpoint (t on the regions' Redis clocks, from before the first
// request), and at the end at least 99% of it (b + r·t is what an ideal
// central bucket admits of the same offered load, which always exceeds
// r). The shortfall is reported per second against the ideal central
// bucket, and split into the first second, the start (until the first
// shift), and the time after each shift.
//
// make test runs a scaled-down run (6 s then 3 s) that checks conformance
// and that the key is served; SLUICE_SOAK=1 runs the full one (60 s then
// 30 s), which also holds the fleet to 99% of b + r·t.
func TestDeliverTheLimitThroughShifts(t *testing.T) {
	first, second := 6*time.Second, 3*time.Second
	soak := os.Getenv("SLUICE_SOAK") != ""
	if soak {
		first, second = 60*time.Second, 30*time.Second
	}
	c := startCluster(t, devcluster.Options{Config: mustConfig(t, deliverConfig), GlobalReplicas: 1})
	key := quota.Key{Tenant: "acme", Class: "write"}
	const r, b = 1000.0, 1000.0
	l := &offeredLoad{t: t, key: key, clients: map[string]*lease.Client{}, stop: make(chan struct{}),
		phases: []loadPhase{{first, []float64{1050, 300, 150}}, {second, []float64{150, 300, 1050}}}}
	for _, name := range deliverRegions {
		conn, err := grpc.NewClient(c.RegionalAddrs(name)[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		// A slow acquire on a loaded machine must not turn into the class's
		// on_failure decision: that would measure the machine.
		cl, err := lease.NewClient(conn, lease.Options{InstanceID: "deliver-" + name, BreakerTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close(context.Background()) })
		l.clients[name] = cl
	}

	// t0 is the earliest Redis clock of the regions, read before any
	// request: every bound below is measured from it.
	var t0 time.Time
	for _, name := range deliverRegions {
		if rt := redisTime(t, c, name); t0.IsZero() || rt.Before(t0) {
			t0 = rt
		}
	}
	l.start = time.Now()
	l.run()
	var worst float64 = math.Inf(-1) // largest admitted − (b + r·t) seen
	tick := time.NewTicker(100 * time.Millisecond)
	for time.Since(l.start) < l.length() {
		<-tick.C
		// The count is read before the clock: the bound can only be looser
		// by the read's own duration.
		got := float64(l.total.Load())
		bound := b + r*redisTime(t, c, deliverRegions[0]).Sub(t0).Seconds()
		worst = max(worst, got-bound)
		if got > bound {
			t.Errorf("over-admission: %.0f admitted, b + r·t = %.1f", got, bound)
		}
	}
	tick.Stop()
	close(l.stop)
	l.wg.Wait()
	var held int64
	for _, cl := range l.clients {
		held += cl.Table().HeldTokens()
	}
	elapsed := redisTime(t, c, deliverRegions[0]).Sub(t0).Seconds()
	bound := b + r*elapsed
	admitted := float64(l.total.Load())
	if admitted+float64(held) > bound {
		t.Errorf("over-admission: %.0f admitted + %d held > b + r·t = %.1f", admitted, held, bound)
	}

	slices.SortFunc(l.records, func(x, y attempt) int { return int(x.at - y.at) })
	ideal := idealCentral(l.records, r, b)
	secs := int(math.Ceil(l.length().Seconds()))
	got, want := make([]float64, secs), make([]float64, secs)
	perRegion := make([][3]float64, secs)
	// Admissions count in the second they were decided, the ideal's in
	// the second their requests were due (it decides at once).
	var lag time.Duration
	for i, a := range l.records {
		if a.allowed {
			s := min(int(a.decided/time.Second), secs-1)
			got[s]++
			perRegion[s][a.region]++
		}
		if ideal[i] {
			want[min(int(a.at/time.Second), secs-1)]++
		}
		lag = max(lag, a.decided-a.at)
	}
	var sb strings.Builder
	for s := range secs {
		fmt.Fprintf(&sb, "\n  s%-3d admitted %5.0f (%4.0f/%4.0f/%4.0f) ideal %5.0f short %5.0f", s+1, got[s],
			perRegion[s][0], perRegion[s][1], perRegion[s][2], want[s], want[s]-got[s])
	}
	lost := func(from, to int) float64 {
		var n float64
		for s := from; s < min(to, secs); s++ {
			n += want[s] - got[s]
		}
		return n
	}
	shift := int(first / time.Second)
	var idealTotal float64
	for _, w := range want {
		idealTotal += w
	}
	t.Logf("per second (admitted us-east/eu-west/ap-south; ideal central bucket on the same offered load):%s", sb.String())
	t.Logf("offered %d in %.2fs of Redis time: admitted %.0f (+%d held) = %.2f%% of b + r·t = %.0f, %.2f%% of the ideal central bucket's %.0f; "+
		"first second %.0f (ideal %.0f); lost vs the ideal: first second %.0f, start (until the shift) %.0f, after the shift %.0f; worst checkpoint margin %.1f; %d degraded decisions; longest from due to decided %v",
		len(l.records), elapsed, admitted, held, 100*admitted/bound, bound, 100*admitted/idealTotal, idealTotal,
		got[0], want[0], want[0]-got[0], lost(0, shift), lost(shift, secs), worst, l.degraded.Load(), lag.Round(time.Millisecond))
	if !soak {
		// Liveness only: the scaled-down run is dominated by what the
		// start costs (BENCHMARKS.md has the figures of both runs).
		if admitted < b+r*elapsed/2 {
			t.Errorf("admitted %.0f < b + r·t/2 = %.0f: the key was not served", admitted, b+r*elapsed/2)
		}
		return
	}
	if admitted < 0.99*bound {
		t.Errorf("admitted %.0f < 99%% of b + r·t = %.0f", admitted, bound)
	}
}
