package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional"
)

const threeRegions = `
epoch: 200ms
grant_validity: 1s
lease_ttl: 1s
refresh: 100ms
regions:
  us-east:  {weight: 2}
  eu-west:  {weight: 1}
  ap-south: {weight: 1}
classes:
  read: {mode: lease, on_failure: local}
tiers:
  free: {read: {rate: 10/s, burst: 10}}
  pro:  {read: {rate: 400/s, burst: 200}}
tenants:
  acme: {tier: pro}
default_tier: free
`

const epoch = 200 * time.Millisecond

// waitLeader polls the global replicas until one leads and has left
// learning mode.
func waitLeader(t *testing.T, c *devcluster.Cluster, within time.Duration) (leader string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, addr := range c.GlobalAddrs() {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			st, err := sluicev1.NewAllocatorServiceClient(conn).Status(ctx, &sluicev1.StatusRequest{})
			cancel()
			conn.Close()
			if err == nil && st.Leader && !st.Learning {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no global leader out of learning mode within %v", within)
		}
		time.Sleep(20 * time.Millisecond) // polling leadership with a deadline
	}
}

// waitGrant polls region's bucket until it refills at >= want tokens/s,
// and returns how long that took.
func waitGrant(t *testing.T, c *devcluster.Cluster, region string, key quota.Key, want float64, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		st := regionRate(t, c, region, key)
		if st.Rate >= want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			dumpStatus(t, c)
			t.Fatalf("%s: rate %.1f after %v, want >= %.1f", region, st.Rate, within, want)
		}
		time.Sleep(10 * time.Millisecond) // polling Redis state with a deadline
	}
}

// waitGrantRounds is waitGrant with its deadline in maxRounds of the
// region's epoch reports (its own epochs, which a starved process runs
// fewer of than the wall clock's). When the deadline passes while the load
// offered the region less than want (a machine starved of CPU runs the
// load generator's goroutines too rarely to ask for it), the demand the
// region reports rightly stays below want and so does its grant: the
// scenario the test needs cannot be set up, and the test is skipped
// saying so. Otherwise a region that does not get there fails.
func waitGrantRounds(t *testing.T, c *devcluster.Cluster, l *load, region string, key quota.Key, want float64, maxRounds int64) time.Duration {
	t.Helper()
	start, rounds0 := time.Now(), regionReports(t, c, region, "epoch")
	m := &offeredMeter{l: l, region: region}
	for {
		st := regionRate(t, c, region, key)
		m.note(st.NowUS)
		if st.Rate >= want {
			return time.Since(start)
		}
		if n := regionReports(t, c, region, "epoch") - rounds0; n > maxRounds {
			if offered := m.rate(offeredSpan); offered < want {
				t.Skipf("%s: the load offered %.0f/s over the region's last %v, below the %.0f/s the scenario needs: the machine is too busy to set it up (rate %.1f after %d of the region's epoch reports)",
					region, offered, offeredSpan, want, st.Rate, n)
			}
			dumpStatus(t, c)
			t.Fatalf("%s: rate %.1f after %d of the region's epoch reports (%v), want >= %.1f", region, st.Rate, n, time.Since(start), want)
		}
		time.Sleep(10 * time.Millisecond) // polling Redis state with a deadline in the region's epochs
	}
}

// offeredSpan is the stretch of a region's time over which offeredMeter
// judges what the load asked of it: a few epochs, so a load generator that
// has only just caught up is judged on what it offers now.
const offeredSpan = 5 * epoch

// offeredMeter follows the requests the load offered a region (those the
// region decided) against the region's Redis clock.
type offeredMeter struct {
	l       *load
	region  string
	samples []offeredSample
}

type offeredSample struct{ us, n int64 }

// note records the load's count at the region's Redis time nowUS.
func (m *offeredMeter) note(nowUS int64) {
	m.samples = append(m.samples, offeredSample{us: nowUS, n: m.l.att[m.region].Load()})
}

// rate is the requests per second the load offered the region over the
// last span of the region's time noted (over all of it when shorter).
func (m *offeredMeter) rate(span time.Duration) float64 {
	if len(m.samples) < 2 {
		return 0
	}
	last := m.samples[len(m.samples)-1]
	first := m.samples[0]
	for _, s := range m.samples {
		if last.us-s.us <= span.Microseconds() {
			first = s
			break
		}
	}
	if last.us <= first.us {
		return 0
	}
	return float64(last.n-first.n) / (float64(last.us-first.us) / 1e6)
}

// TestDemandShiftsBetweenRegions: a tenant's saturating demand moves from
// us-east to eu-west. Globally admitted never exceeds b + r·t; the
// demanding region's grant reaches its weighted max-min share (all of r)
// within a few of its own report rounds once the allocator's demand
// estimate says so; in steady state the fleet admits >= 95% of the demand
// actually offered, up to r, less the tokens the region still holds for
// it at the end of the window it is judged over.
//
// Everything that is not a conformance bound is counted on the system's
// own events, not on the wall clock: on a machine starved of CPU the load
// generator cannot always offer r (each Allow that waits for a refill
// waits on an RPC), so the region reports less demand and the allocator
// rightly targets less; and region leaders run fewer report rounds than
// wall-clock epochs.
func TestDemandShiftsBetweenRegions(t *testing.T) {
	c := startCluster(t, devcluster.Options{Config: mustConfig(t, threeRegions), GlobalReplicas: 2, SessionTTL: time.Second})

	key := quota.Key{Tenant: "acme", Class: "read"}
	const r, b = 400.0, 200.0
	start := time.Now()
	l := startLoad(t, c, key, 100*time.Millisecond, 6)
	conf := watchConformance(t, l, r, b, start, 50*time.Millisecond)

	for _, region := range []string{"us-east", "eu-west"} {
		l.set(region)
		seen := waitDemandSeen(t, c, region, key, 20)
		cv, ok := waitConverged(t, c, l, region, key, 0.95*r)
		if !ok {
			continue
		}
		t.Logf("%s: the global tier saw the demand %d of the region's epoch reports after the shift; %d of its epoch reports and %d reports of any kind later the grant reached 95%% of r, %d of its epochs after the allocator's target for it last rose there",
			region, seen, cv.epochs, cv.rounds, cv.roundsFromTarget)
		// Once the allocator targets all of r for the region, moving the
		// capacity takes the donors' next reports (answered from their new
		// demand, each acknowledged at once by an extra report) and the
		// recipient's next report, early when it was told a raise is
		// pending. Counted in the recipient's own epochs (its epoch
		// reports; donors report on the same period): two, and one more
		// because the report that raised the target may be counted before
		// the poll saw the target.
		if cv.roundsFromTarget > 3 {
			t.Errorf("%s: grant took %d of the region's epochs after the allocator targeted r, want <= 3", region, cv.roundsFromTarget)
		}
		// Steady state: over a window of 1.5s of the region's Redis time,
		// with the region saturated (the load offered at least r·t: each
		// Allow call is one token asked for), the fleet admits >= 95% of
		// r·t. A load generator starved of CPU offers less, and in bursts
		// (its goroutines run in bursts): the demand the instance reports,
		// measured on its own clock, rightly follows those bursts, and so
		// does its grant; then there is no steady state to judge, and the
		// window is only logged.
		//
		// The window opens once the global tier's demand estimate for the
		// region reaches r: the readings of a region that just took the
		// load over lag behind it (its leases' first demand windows, the
		// estimate's smoothing), and the allocator rightly grants what it
		// reads.
		if !waitDemandReaches(t, c, l, region, key, r, 20) {
			continue
		}
		rs0 := regionRate(t, c, region, key)
		before, asked, onFailure := l.total.Load(), l.attempts.Load(), l.onFailure.Load()
		// The region's bucket rate is sampled through the window: when
		// admission falls short, this says whether the grant fell back
		// (the allocator's demand estimate dropped) or the instances could
		// not use it.
		lowest, lowDemand := r, globalDemand(t, c, region, key)
		var held float64 // ∫ min(rate, r) dt over the window, tokens
		tl := []string{sample(t, c, region, key, l, rs0)}
		rs := rs0
		for rs.NowUS-rs0.NowUS < 1500*time.Millisecond.Microseconds() {
			time.Sleep(100 * time.Millisecond) // sampling the region's rate through the window
			prev := rs
			rs = regionRate(t, c, region, key)
			held += min(prev.Rate, r) * float64(rs.NowUS-prev.NowUS) / 1e6
			lowest = min(lowest, rs.Rate)
			lowDemand = min(lowDemand, globalDemand(t, c, region, key))
			tl = append(tl, sample(t, c, region, key, l, rs))
		}
		admitted, offered := float64(l.total.Load()-before), float64(l.attempts.Load()-asked)
		window := float64(rs.NowUS-rs0.NowUS) / 1e6
		// kept is what the region holds at the window's end beyond what
		// it held at its start: tokens in its bucket and unspent in its
		// instances' leases (as last reported), both read with the
		// window's clock. Never below 0: the leases' tokens as last
		// reported include some the instances spent since, so a fall
		// may be tokens admitted before the window.
		kept := max(0, rs.Holding()-rs0.Holding())
		t.Logf("%s: steady state: admitted %.1f/s of %.1f/s offered (%.1f%% of r) over %.2fs of the region's time; the region's rate fell to %.1f/s and the global tier's demand reading to %.1f/s in the window; it held %.0f tokens in its bucket and leases at the window's start, %.0f at its end",
			region, admitted/window, offered/window, 100*admitted/window/r, window, lowest, lowDemand, rs0.Holding(), rs.Holding())
		// When the global tier's reading of the region's demand dipped
		// below r in the window (a starved load generator offers in
		// bursts, and the instance's readings follow them), the allocator
		// rightly granted less for a while: then the fleet must admit 95%
		// of what the region held, the instances' part of the promise.
		//
		// Either way, of the tokens the region refilled in the window,
		// those it still holds at its end beyond what it held at its
		// start were not admitted yet, and not lost: a lease refill a
		// busy machine ran late leaves them in the bucket, and they are
		// admitted just after the window. On a busy machine that
		// difference moved a 1.5 s window's admissions by up to 15% of
		// r·t, admissions following refill − kept within a few tokens.
		// Refill lost for good, into a bucket at its cap because the
		// instances did not take it, still counts against the fleet;
		// kept is at most the region's cap.
		want, of := 0.95*(r*window-kept), "r·t"
		if lowDemand < r {
			want, of = 0.95*(held-kept), "the rate the region held"
		}
		switch {
		case offered < r*window:
			t.Logf("%s: the load offered %.0f tokens, below r·t = %.0f: not saturated, steady state not judged", region, offered, r*window)
		case l.starvedSince(onFailure) > 0:
			t.Logf("%s: the instances decided %d requests by on_failure in the window (answers later than the requests' waits: a starved machine), steady state not judged", region, l.starvedSince(onFailure))
		case admitted < want:
			for _, x := range tl {
				t.Log(x)
			}
			t.Errorf("%s: admitted %.0f with %.0f offered in %.2fs, want >= 95%% of %s less the %.0f tokens the region kept = %.0f; the region's rate fell to %.1f/s", region, admitted, offered, window, of, kept, want, lowest)
		}
	}
	l.halt()
	conf.finish()
	t.Logf("conformance: %d checkpoints, worst margin %d tokens (negative = under the bound)", conf.samples.Load(), conf.worst.Load())
	reports := map[string]float64{}
	for _, kind := range []string{"epoch", "ack", "catch_up"} {
		for _, reg := range c.Regions {
			for _, rep := range reg.Replicas {
				reports[kind] += counterWithLabel(t, rep.Daemon(), "sluice_regional_global_reports_total", "kind", kind)
			}
		}
	}
	t.Logf("region reports to the global tier: %v", reports)
	// Each shift moved capacity to a region whose raise waited on the
	// donors' acknowledgements: it was told to report again early.
	if reports["catch_up"] == 0 || reports["ack"] == 0 {
		t.Errorf("reports %v: want acknowledgements and catch-up reports while capacity moved", reports)
	}
}

// regionReports is how many reports of the given kinds (epoch, ack,
// catch_up; all when none is named) region's replicas, whichever leads,
// have sent the global tier.
func regionReports(t *testing.T, c *devcluster.Cluster, region string, kinds ...string) int64 {
	t.Helper()
	if len(kinds) == 0 {
		kinds = []string{"epoch", "ack", "catch_up"}
	}
	var n float64
	for _, rep := range c.Regions[region].Replicas {
		for _, kind := range kinds {
			n += counterWithLabel(t, rep.Daemon(), "sluice_regional_global_reports_total", "kind", kind)
		}
	}
	return int64(n)
}

// converged is how long a grant took, counted in the system's own events.
type converged struct {
	epochs           int64 // the region's epoch reports since the wait began
	rounds           int64 // its reports of any kind since the wait began
	roundsFromTarget int64 // its epoch reports since the allocator's target for it last reached want
}

// waitConverged polls until region's bucket refills at >= want tokens/s.
// It notes the region's report count whenever the allocator's target for
// region rises to >= want, and forgets it when the target falls below
// (the demand estimate fell: the load generator could not offer it). The
// deadline is counted in the region's epoch reports (the allocator's
// epoch counter starts again at a global leader change). It returns false,
// logging why, when the deadline passes while the load offered the region
// less than want: a demand that was never offered is not a convergence
// the test can judge. Offered and not granted fails the test.
func waitConverged(t *testing.T, c *devcluster.Cluster, l *load, region string, key quota.Key, want float64) (converged, bool) {
	t.Helper()
	const maxEpochs = 100
	epochs0, rounds0 := regionReports(t, c, region, "epoch"), regionReports(t, c, region)
	targetAt := int64(-1)
	m := &offeredMeter{l: l, region: region}
	for {
		st := leaderStatus(t, c)
		rounds := regionReports(t, c, region)
		// The region's own epochs: while a raise is pending it also sends
		// catch-up reports every third of an epoch, and acknowledgements,
		// which would make any count of reports of all kinds run ahead of
		// the donors' reports that actually free the capacity.
		epochs := regionReports(t, c, region, "epoch")
		if st != nil {
			target := keyRegionStatus(st, region, key).GetTarget()
			switch {
			case target < want:
				targetAt = -1
			case targetAt < 0:
				targetAt = epochs
			}
		}
		rs := regionRate(t, c, region, key)
		m.note(rs.NowUS)
		if rs.Rate >= want {
			cv := converged{epochs: epochs - epochs0, rounds: rounds - rounds0, roundsFromTarget: epochs - targetAt}
			if targetAt < 0 { // raised before the poll saw the target
				cv.roundsFromTarget = 0
			}
			return cv, true
		}
		if epochs-epochs0 > maxEpochs {
			// A load generator starved of CPU that cannot offer want makes
			// no demand for the allocator to follow: nothing to judge.
			if offered := m.rate(offeredSpan); offered < want {
				t.Logf("%s: the load offered %.0f/s over the region's last %v, below %.0f/s, and the grant is %.1f/s after %d of the region's epoch reports: not saturated, convergence not judged",
					region, offered, offeredSpan, want, rs.Rate, maxEpochs)
				return converged{}, false
			}
			dumpStatus(t, c)
			t.Fatalf("%s: grant below %.1f after %d of the region's epoch reports (%d reports of any kind)", region, want, maxEpochs, rounds-rounds0)
		}
		time.Sleep(10 * time.Millisecond) // polling the allocator and Redis with a deadline in epochs
	}
}

// counterWithLabel sums the counter name's series with label=value in d's
// registry.
func counterWithLabel(t *testing.T, d *regional.Daemon, name, label, value string) float64 {
	t.Helper()
	fams, err := d.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func dumpStatus(t *testing.T, c *devcluster.Cluster) {
	for _, addr := range c.GlobalAddrs() {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			continue
		}
		st, err := sluicev1.NewAllocatorServiceClient(conn).Status(context.Background(), &sluicev1.StatusRequest{TopKeys: 5})
		conn.Close()
		t.Logf("global %s: %v %v", addr, st, err)
	}
}

// leaderStatus is the global leader's Status, or nil when no replica
// answers as leader.
func leaderStatus(t *testing.T, c *devcluster.Cluster) *sluicev1.StatusResponse {
	t.Helper()
	for _, addr := range c.GlobalAddrs() {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		st, err := sluicev1.NewAllocatorServiceClient(conn).Status(context.Background(), &sluicev1.StatusRequest{TopKeys: 10})
		conn.Close()
		if err == nil && st.Leader {
			return st
		}
	}
	return nil
}

// waitDemandSeen polls the global leader's Status until region's demand
// for key exceeds its static share (the shift is visible to the
// allocator) and returns how many epoch reports the region sent until
// then. The deadline is maxRounds of them: the region's own epochs, which
// a starved process runs fewer of than the wall clock's.
func waitDemandSeen(t *testing.T, c *devcluster.Cluster, region string, key quota.Key, maxRounds int64) int64 {
	t.Helper()
	rounds0 := regionReports(t, c, region, "epoch")
	for {
		rounds := regionReports(t, c, region, "epoch") - rounds0
		if rs := keyRegionStatus(leaderStatus(t, c), region, key); rs != nil && rs.GetDemand() > rs.GetStaticRate() {
			return rounds
		}
		if rounds > maxRounds {
			dumpStatus(t, c)
			t.Fatalf("%s: the global tier did not see the demand within %d of the region's epoch reports", region, maxRounds)
		}
		time.Sleep(5 * time.Millisecond) // polling the allocator with a deadline in the region's epochs
	}
}

// waitDemandReaches waits until the global leader's demand estimate for
// key in region reaches want, within maxRounds of the region's epoch
// reports. When it does not and the load offered the region less than
// want over the last offeredSpan (a starved load generator), it logs that
// and returns false: there is no saturated steady state to judge. A region
// that was offered want and whose demand the global tier still does not
// see fails the test.
func waitDemandReaches(t *testing.T, c *devcluster.Cluster, l *load, region string, key quota.Key, want float64, maxRounds int64) bool {
	t.Helper()
	rounds0 := regionReports(t, c, region, "epoch")
	m := &offeredMeter{l: l, region: region}
	for {
		m.note(regionRate(t, c, region, key).NowUS)
		demand := globalDemand(t, c, region, key)
		if demand >= want {
			return true
		}
		if rounds := regionReports(t, c, region, "epoch") - rounds0; rounds > maxRounds {
			if offered := m.rate(offeredSpan); offered < want {
				t.Logf("%s: the load offered %.0f/s over the region's last %v, below %.0f/s, and the global tier reads %.1f/s: not saturated, steady state not judged", region, offered, offeredSpan, want, demand)
				return false
			}
			dumpStatus(t, c)
			t.Fatalf("%s: the global tier reads a demand of %.1f/s after %d of the region's epoch reports, want >= %.1f (the load offers it)", region, demand, rounds, want)
		}
		time.Sleep(5 * time.Millisecond) // polling the allocator with a deadline in the region's epochs
	}
}

// globalDemand is the global leader's demand estimate for key in region
// (tokens/s); -1 when no leader answers or it does not know the key.
func globalDemand(t *testing.T, c *devcluster.Cluster, region string, key quota.Key) float64 {
	t.Helper()
	if rs := keyRegionStatus(leaderStatus(t, c), region, key); rs != nil {
		return rs.GetDemand()
	}
	return -1
}

// keyRegionStatus is what st says of key in region; nil when st is nil or
// does not name them.
func keyRegionStatus(st *sluicev1.StatusResponse, region string, key quota.Key) *sluicev1.KeyRegionStatus {
	return st.KeyRegion(key.Tenant, key.Class, region)
}

// sample is one line of the steady-state window's timeline, logged when
// admission falls short: the load's counts, the region's bucket as its
// Redis holds it, and what the global leader believes of the region.
func sample(t *testing.T, c *devcluster.Cluster, region string, key quota.Key, l *load, rs luascripts.State) string {
	t.Helper()
	s := fmt.Sprintf("offered %d admitted %d; redis at %dµs: rate %.1f tokens %.1f out %d lease demand %.1f",
		l.attempts.Load(), l.total.Load(), rs.NowUS, rs.Rate, rs.Tokens, rs.Outstanding, rs.LeaseDemand)
	st := leaderStatus(t, c)
	if st == nil {
		return s + "; no global leader"
	}
	s += fmt.Sprintf("; global %s learning=%v epoch %d:", st.LeaderAddr, st.Learning, st.Epoch)
	for _, ks := range st.Keys {
		if ks.Key.Tenant != key.Tenant || ks.Key.Class != key.Class {
			continue
		}
		for _, x := range ks.Regions {
			s += fmt.Sprintf(" %s demand %.1f target %.1f grant %.1f (%dms)", x.Region, x.Demand, x.Target, x.GrantedRate, x.ValidMs)
		}
	}
	return s
}
