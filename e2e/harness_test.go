package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

// load drives saturating demand for one key from one instance per region
// and counts admissions. Demand is switched per region.
//
// adm and total count the admissions the region backed: those b + r·t
// bounds. An admission the class's on_failure policy decided (Degraded:
// the instance's acquire outlived the breaker timeout, which a CPU-starved
// machine causes even with Redis up) is outside the bound by the class's
// choice (docs/architecture.md) and is counted in degraded only; attempts
// counts only the requests the region decided.
type load struct {
	t        *testing.T
	key      quota.Key
	clients  map[string]*lease.Client
	on       map[string]*atomic.Bool
	adm      map[string]*atomic.Int64
	att      map[string]*atomic.Int64 // per region, as attempts
	total    atomic.Int64
	degraded atomic.Int64
	attempts atomic.Int64
	// onFailure counts every decision the class's on_failure policy made,
	// admitted or denied.
	onFailure atomic.Int64
	stop      chan struct{}
	wg        sync.WaitGroup
}

func startLoad(t *testing.T, c *devcluster.Cluster, key quota.Key, refresh time.Duration, workers int) *load {
	t.Helper()
	l := &load{t: t, key: key, clients: map[string]*lease.Client{}, on: map[string]*atomic.Bool{},
		adm: map[string]*atomic.Int64{}, att: map[string]*atomic.Int64{}, stop: make(chan struct{})}
	for name := range c.Regions {
		conn, err := grpc.NewClient(c.RegionalAddrs(name)[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		cl, err := lease.NewClient(conn, lease.Options{InstanceID: "inst-" + name, Refresh: refresh})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close(context.Background()) })
		l.clients[name] = cl
		l.on[name] = new(atomic.Bool)
		l.adm[name] = new(atomic.Int64)
		l.att[name] = new(atomic.Int64)
	}
	// The maps are complete before any worker reads them.
	for name, cl := range l.clients {
		for range workers {
			l.wg.Add(1)
			go l.work(name, cl)
		}
	}
	t.Cleanup(l.halt)
	return l
}

func (l *load) work(region string, c *lease.Client) {
	defer l.wg.Done()
	idle := time.NewTicker(5 * time.Millisecond)
	defer idle.Stop()
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		if !l.on[region].Load() {
			select {
			case <-l.stop:
				return
			case <-idle.C:
			}
			continue
		}
		d, err := c.Allow(context.Background(), l.key, 1)
		if err != nil {
			l.t.Errorf("%s: allow: %v", region, err)
			return
		}
		// attempts counts the requests the region decided, as total does.
		if d.Degraded {
			l.onFailure.Add(1)
			if d.Allowed {
				l.degraded.Add(1)
				continue
			}
		} else {
			l.attempts.Add(1)
			l.att[region].Add(1)
		}
		if d.Allowed {
			l.adm[region].Add(1)
			l.total.Add(1)
			continue
		}
		// Pace denials as a client honouring Retry-After would.
		select {
		case <-l.stop:
			return
		case <-time.After(min(max(d.RetryAfter, time.Millisecond), 5*time.Millisecond)):
		}
	}
}

// starvedSince is how many requests the class's on_failure policy
// decided since onFailure read from (l.onFailure.Load() at a window's
// start). The tests inject no fault while they judge a steady state, so
// any such decision means an instance's refill came later than the
// request's wait: a machine too starved to run it in time, whose region's
// tokens the instances could not take then, so the window says nothing
// of the fleet's use of them.
func (l *load) starvedSince(from int64) int64 { return l.onFailure.Load() - from }

func (l *load) set(regions ...string) {
	for name, b := range l.on {
		want := false
		for _, r := range regions {
			want = want || r == name
		}
		b.Store(want)
	}
}

func (l *load) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// regionRate is the state of the region's bucket for key now, read from
// its Redis through a running replica: the rate it refills at (its grant
// while valid, else its static share), its tokens and its clock.
//
// The read uses the replica's own Redis client, whose timeout (the
// daemon's RedisTimeout, 500ms) a redis-server starved of CPU outlasts: a
// read that timed out failed to observe, not the system, and is read
// again, a bounded number of times.
func regionRate(t *testing.T, c *devcluster.Cluster, region string, key quota.Key) luascripts.State {
	t.Helper()
	st, err := bucketState(context.Background(), c, region, key)
	for try := 1; try < 5 && isTimeout(err); try++ {
		st, err = bucketState(context.Background(), c, region, key)
	}
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// conformance watches total admissions against b + r·t at every
// checkpoint and fails the test on the first violation.
type conformance struct {
	t       *testing.T
	l       *load
	r, b    float64
	start   time.Time
	worst   atomic.Int64 // largest (admitted - bound), tokens
	stop    chan struct{}
	done    chan struct{}
	samples atomic.Int64
}

func watchConformance(t *testing.T, l *load, r, b float64, start time.Time, every time.Duration) *conformance {
	c := &conformance{t: t, l: l, r: r, b: b, start: start, stop: make(chan struct{}), done: make(chan struct{})}
	c.worst.Store(-1 << 62)
	go func() {
		defer close(c.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				c.check()
				return
			case <-tick.C:
				c.check()
			}
		}
	}()
	t.Cleanup(c.finish)
	return c
}

func (c *conformance) check() {
	// Read the count before the clock: the bound can only be looser.
	got := c.l.total.Load()
	bound := c.b + c.r*time.Since(c.start).Seconds()
	over := got - int64(bound)
	for {
		w := c.worst.Load()
		if over <= w || c.worst.CompareAndSwap(w, over) {
			break
		}
	}
	c.samples.Add(1)
	if float64(got) > bound {
		c.t.Errorf("over-admission: %d admitted after %.2fs, b + r·t = %.1f", got, time.Since(c.start).Seconds(), bound)
	}
}

func (c *conformance) finish() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

func mustConfig(t *testing.T, y string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

var _ = regional.ColdStartFull

// startCluster runs a deployment for the test, stopped at cleanup, and
// waits until a global leader has left learning mode.
func startCluster(t *testing.T, o devcluster.Options) *devcluster.Cluster {
	t.Helper()
	c, err := devcluster.Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	if o.GlobalReplicas >= 0 {
		waitLeader(t, c, 15*time.Second)
	}
	return c
}
