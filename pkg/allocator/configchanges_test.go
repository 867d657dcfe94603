package allocator

import (
	"container/heap"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// TestConfigChangesNeverOversubscribe: the global tier's Service against
// three model regions through drains, restores, weight and validity
// changes that reach the regions and the global tier at different times,
// while reports and answers are delayed or lost, set_rate calls fail (a
// grant answered but never installed: the region runs on what it held,
// then on its static share), another replica takes over the global tier,
// and a second leader of a region reports while the first one's report is
// in flight. Each region keeps its static shares with the shipped
// regionsync.Chain (decreases at once, raises on a confirmation) and
// measures a grant from its report's state read, as the region leader does.
// At every instant, from the regions' side, the rates and burst caps in
// force sum to at most the key's: invariants 2 and 3 of
// docs/architecture.md across config revisions.
func TestConfigChangesNeverOversubscribe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rapid.Check(noDeadline{t}, configChanges)
	})
}

// noDeadline hides the test's deadline from rapid, which reads it to
// stop early and may not inside a synctest bubble.
type noDeadline struct{ *testing.T }

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// ccRegions are the model's regions, in config order.
var ccRegions = []string{"a", "b", "c"}

// ccConfig is the config of one revision: each region's weight and
// whether it is drained.
type ccConfig struct {
	weight   [3]int
	drained  [3]bool
	floor    string // the class's partition_share
	validity int    // grant_validity, ms
}

func (c ccConfig) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "epoch: 100ms\ngrant_validity: %dms\nregion_lease: 60s\nregions:\n", c.validity)
	for i, r := range ccRegions {
		fmt.Fprintf(&b, "  %s: {weight: %d", r, c.weight[i])
		if c.drained[i] {
			b.WriteString(", drained: true")
		}
		b.WriteString("}\n")
	}
	fmt.Fprintf(&b, "classes:\n  write: {partition_share: %s}\ntiers:\n  free: {write: {rate: 10/s, burst: 20}}\ndefault_tier: free\n", c.floor)
	return b.String()
}

type ccEventKind int

const (
	ccStep      ccEventKind = iota // the leader's allocation epoch
	ccSend                         // a region leader reads Redis TIME: the report's send time
	ccRead                         // it reads the key's state into the report
	ccDeliver                      // the report reaches the global tier
	ccAnswer                       // its answer reaches the region
	ccAdopt                        // a region adopts a revision
	ccGlobalCfg                    // the global tier's watch delivers a revision
	ccExpire                       // a grant or static lease may end: check
	ccDemand                       // a region's demand changes
)

type ccEvent struct {
	at     time.Time
	order  int
	kind   ccEventKind
	region int
	rev    int64
	rep    *sluicev1.RegionReport
	sentAt time.Time
	readAt time.Time // when the report read the key's state
	answer *sluicev1.RegionGrants
}

type ccQueue []*ccEvent

func (q ccQueue) Len() int { return len(q) }
func (q ccQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].order < q[j].order
}
func (q ccQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *ccQueue) Push(x any)   { *q = append(*q, x.(*ccEvent)) }
func (q *ccQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// ccRegion is one model region's view of the key.
type ccRegion struct {
	chain       regionsync.Chain
	rate, burst float64   // the grant installed
	expiry      time.Time // its end; zero: none
	issued      time.Time // send time of the report it answered (set_rate's fence)
	leaseEnd    time.Time // static lease
	seq         uint64
	demand      float64
	inFlight    int // reports in flight
}

func configChanges(t *rapid.T) {
	key := quota.Key{Tenant: "t", Class: "write"}
	floor := rapid.SampledFrom([]string{"0", "0", "0.5"}).Draw(t, "floor")
	cfgs := []ccConfig{{weight: [3]int{2, 1, 1}, floor: floor, validity: 500}}
	for n := rapid.IntRange(1, 4).Draw(t, "changes"); len(cfgs) <= n; {
		next := cfgs[len(cfgs)-1]
		i := rapid.IntRange(0, 2).Draw(t, "changedRegion")
		switch rapid.IntRange(0, 5).Draw(t, "change") {
		case 0, 1:
			next.drained[i] = !next.drained[i]
		case 2:
			next.validity = rapid.SampledFrom([]int{400, 500, 800}).Draw(t, "validityMs")
		default:
			next.weight[i] = rapid.IntRange(1, 3).Draw(t, "weight")
		}
		if next.drained == [3]bool{true, true, true} {
			continue
		}
		cfgs = append(cfgs, next)
	}
	parsed := make([]*config.Config, len(cfgs))
	for i, c := range cfgs {
		p, err := config.Parse([]byte(c.yaml()))
		if err != nil {
			t.Fatalf("config %d: %v\n%s", i+1, err, c.yaml())
		}
		parsed[i] = p
	}
	rev := func(i int) int64 { return int64(i + 1) }

	src := configtest.NewSource(parsed[0], 1)
	s, err := newService(serviceOptions{config: src, advertise: "self:7500", logger: slog.New(slog.DiscardHandler)}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.promote(1, time.Now().Add(time.Hour), nil)
	// Perhaps another replica takes over at some epoch: it starts with
	// what it reads then (the live config only) and learns.
	failoverAt := -1
	if rapid.Bool().Draw(t, "failover") {
		failoverAt = rapid.IntRange(5, 60).Draw(t, "failoverEpoch")
	}

	const epoch = 100 * time.Millisecond
	loseReport := rapid.Float64Range(0, 0.2).Draw(t, "loseReport")
	loseAnswer := rapid.Float64Range(0, 0.2).Draw(t, "loseAnswer")
	failApply := rapid.Float64Range(0, 0.6).Draw(t, "failApply")
	// A second leader of a region (one whose session ended but who does
	// not know it yet) may report while the first one's report is in
	// flight, and install its answer between the other's send time and
	// its state read.
	overlap := rapid.SampledFrom([]float64{0, 0, 0.3}).Draw(t, "overlap")
	maxDelay := time.Duration(rapid.IntRange(0, 80).Draw(t, "maxDelayMs")) * time.Millisecond
	delay := func(label string) time.Duration {
		if maxDelay == 0 {
			return 0
		}
		return time.Duration(rapid.Int64Range(0, int64(maxDelay)).Draw(t, label))
	}
	chance := func(p float64, label string) bool { return rapid.Float64Range(0, 1).Draw(t, label) < p }

	start := time.Now()
	regions := make([]*ccRegion, len(ccRegions))
	for i := range regions {
		regions[i] = &ccRegion{chain: regionsync.NewChain(1, parsed[0]), leaseEnd: start.Add(time.Minute)}
	}
	var q ccQueue
	order := 0
	push := func(e *ccEvent) {
		order++
		e.order = order
		heap.Push(&q, e)
	}
	end := start.Add(time.Duration(rapid.IntRange(40, 120).Draw(t, "epochs")) * epoch)
	for n, at := 0, start; at.Before(end); n, at = n+1, at.Add(epoch) {
		push(&ccEvent{at: at, kind: ccStep, rev: int64(n)})
	}
	for i := range regions {
		push(&ccEvent{at: start.Add(delay("firstReport")), kind: ccSend, region: i})
		push(&ccEvent{at: start, kind: ccDemand, region: i})
	}
	// Revisions are written an epoch or more apart; each reaches every
	// region and the global tier after its own lag, in order.
	writeAt := start
	adopted := make([]time.Time, len(regions)+1) // per region, then the global tier
	for i := 1; i < len(cfgs); i++ {
		writeAt = writeAt.Add(time.Duration(rapid.IntRange(1, 30).Draw(t, "writeGapEpochs")) * epoch)
		for r := range adopted {
			at := writeAt.Add(time.Duration(rapid.IntRange(0, 8).Draw(t, "adoptLagEpochs"))*epoch + delay("adoptLag"))
			if at.Before(adopted[r]) {
				at = adopted[r]
			}
			adopted[r] = at
			kind := ccAdopt
			if r == len(regions) {
				kind = ccGlobalCfg
			}
			push(&ccEvent{at: at, kind: kind, region: r, rev: rev(i)})
		}
	}

	var log []string
	logf := func(format string, args ...any) {
		log = append(log, fmt.Sprintf("%8.3fs ", time.Since(start).Seconds())+fmt.Sprintf(format, args...))
	}
	// inForce is what region i may use of the key now: its grant, else its
	// static share. Its static lease (a minute at start, renewed by the
	// answers) outlasts every run, so it never runs its floor.
	inForce := func(i int) (rate, burst float64, why string) {
		rg := regions[i]
		now := time.Now()
		if !rg.expiry.IsZero() && now.Before(rg.expiry) {
			return rg.rate, rg.burst, fmt.Sprintf("grant until %.3fs", rg.expiry.Sub(start).Seconds())
		}
		cur := rg.chain.Current()
		res, err := cur.Cfg.Resolve(key)
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
		r, b, err := rg.chain.Share(ccRegions[i], key, cur.Cfg, res)
		if err != nil {
			t.Fatalf("share: %v", err)
		}
		if !now.Before(rg.leaseEnd) {
			t.Fatalf("%s's static lease ended at %v: the model does not run floors", ccRegions[i], rg.leaseEnd.Sub(start))
		}
		return r, b, fmt.Sprintf("static share (chain confirmed %d, current %d)", rg.chain.Confirmed(), cur.Rev)
	}
	check := func() {
		var sumR, sumB float64
		var parts []string
		for i := range regions {
			r, b, why := inForce(i)
			sumR += r
			sumB += b
			parts = append(parts, fmt.Sprintf("%s %.4g/s burst %.4g (%s)", ccRegions[i], r, b, why))
		}
		if sumR > 10*(1+1e-9) || sumB > 20*(1+1e-9) {
			t.Fatalf("at %.3fs: Σ rates %.6g > 10 or Σ bursts %.6g > 20: %s\nconfigs: %+v\nevents:\n%s",
				time.Since(start).Seconds(), sumR, sumB, strings.Join(parts, ", "), cfgs, strings.Join(log, "\n"))
		}
	}

	for q.Len() > 0 {
		e := heap.Pop(&q).(*ccEvent)
		if d := e.at.Sub(time.Now()); d > 0 {
			time.Sleep(d)
		}
		now := time.Now()
		switch e.kind {
		case ccStep:
			if int(e.rev) == failoverAt {
				next, err := newService(serviceOptions{config: src, advertise: "other:7500", logger: slog.New(slog.DiscardHandler)}, now)
				if err != nil {
					t.Fatal(err)
				}
				next.promote(2, now.Add(time.Hour), nil)
				s = next
				logf("another replica leads")
			}
			s.step(now)
		case ccDemand:
			regions[e.region].demand = rapid.SampledFrom([]float64{0, 1, 3, 6, 12}).Draw(t, "demand")
			if now.Before(end) {
				push(&ccEvent{at: now.Add(time.Duration(rapid.IntRange(5, 40).Draw(t, "demandEpochs")) * epoch), kind: ccDemand, region: e.region})
			}
		case ccGlobalCfg:
			src.Set(parsed[e.rev-1], e.rev)
			logf("global tier holds revision %d", e.rev)
		case ccAdopt:
			rg := regions[e.region]
			rg.chain = rg.chain.Adopt(e.rev, parsed[e.rev-1])
			logf("%s adopts revision %d", ccRegions[e.region], e.rev)
		case ccSend:
			rg := regions[e.region]
			if !now.Before(end) {
				break
			}
			if rg.inFlight > 0 && !chance(overlap, "overlap") {
				push(&ccEvent{at: now.Add(epoch), kind: ccSend, region: e.region})
				break
			}
			var revs []int64
			rg.chain, revs = rg.chain.Reported()
			rg.seq++
			rep := &sluicev1.RegionReport{Region: ccRegions[e.region], Seq: rg.seq, ConfigRevisions: revs}
			if now.Before(rg.leaseEnd) {
				rep.StaticValidMs = rg.leaseEnd.Sub(now).Milliseconds()
			}
			rg.inFlight++
			push(&ccEvent{at: now.Add(delay("read")), kind: ccRead, region: e.region, rep: rep, sentAt: now})
		case ccRead:
			rg := regions[e.region]
			rep := e.rep
			kd := &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: key.Tenant, Class: key.Class}, WindowMs: epoch.Milliseconds()}
			r, b, _ := inForce(e.region)
			adm := min(rg.demand, r)
			kd.Admitted = int64(adm * epoch.Seconds())
			kd.Denied = int64((rg.demand - adm) * epoch.Seconds())
			demand := rg.demand
			kd.DemandRate = &demand
			kd.Holding = rapid.Float64Range(0, 1).Draw(t, "holding") * b
			if !rg.expiry.IsZero() && now.Before(rg.expiry) {
				kd.HeldRate, kd.HeldBurst, kd.HeldValidMs = rg.rate, rg.burst, rg.expiry.Sub(now).Milliseconds()
			}
			rep.Keys = []*sluicev1.KeyDemand{kd}
			logf("%s sends seq %d (sent %.3fs): revisions %v, holds %.4g/s burst %.4g for %d ms", ccRegions[e.region], rep.Seq, e.sentAt.Sub(start).Seconds(), rep.ConfigRevisions, kd.HeldRate, kd.HeldBurst, kd.HeldValidMs)
			if chance(loseReport, "loseReport") {
				logf("%s seq %d lost", ccRegions[e.region], rep.Seq)
				rg.inFlight--
				push(&ccEvent{at: now.Add(epoch + delay("retry")), kind: ccSend, region: e.region})
				break
			}
			push(&ccEvent{at: now.Add(delay("deliver")), kind: ccDeliver, region: e.region, rep: rep, sentAt: e.sentAt, readAt: now})
		case ccDeliver:
			g, err := s.Sync(t.Context(), e.rep)
			rg := regions[e.region]
			if err != nil || chance(loseAnswer, "loseAnswer") {
				logf("%s answer to seq %d lost (%v)", ccRegions[e.region], e.rep.GetSeq(), err)
				rg.inFlight--
				push(&ccEvent{at: now.Add(epoch + delay("retry")), kind: ccSend, region: e.region})
				break
			}
			if v := s.View(now); len(v.Keys) > 0 {
				var b strings.Builder
				for j, rv := range v.Keys[0].Regions {
					fmt.Fprintf(&b, " %s %.4g/s (static %.4g, granted %.4g until %.3fs)", v.Regions[j].Name, rv.ReservedRate, rv.StaticRate, rv.GrantedRate, rv.GrantExpiry.Sub(start).Seconds())
				}
				logf("leader reserves%s", b.String())
			}
			for _, kg := range g.GetGrants() {
				logf("global tier answers %s seq %d: %.4g/s burst %.4g for %d ms; confirmed %d/%v", ccRegions[e.region], e.rep.GetSeq(), kg.GetRate(), kg.GetBurst(), kg.GetValidMs(), g.GetConfirmedRevision(), g.GetConfirmedKnown())
			}
			push(&ccEvent{at: now.Add(delay("answer")), kind: ccAnswer, region: e.region, rep: e.rep, sentAt: e.sentAt, readAt: e.readAt, answer: g})
		case ccAnswer:
			rg := regions[e.region]
			g := e.answer
			rg.inFlight--
			if g.GetConfirmedKnown() {
				rg.chain = rg.chain.Confirm(g.GetConfirmedRevision())
			}
			if ms := g.GetStaticLeaseMs(); ms > 0 {
				if end := e.sentAt.Add(time.Duration(ms) * time.Millisecond); end.After(rg.leaseEnd) {
					rg.leaseEnd = end
				}
			}
			for _, kg := range g.GetGrants() {
				if chance(failApply, "failApply") {
					logf("%s: set_rate of seq %d's grant failed", ccRegions[e.region], e.rep.GetSeq())
					continue
				}
				// Measured from the state read, as the region leader does
				// (regionsync.Install.ReadAt).
				from := e.readAt
				if from.Before(rg.issued) {
					continue // stale: set_rate ignores it
				}
				rg.rate, rg.burst = kg.GetRate(), kg.GetBurst()
				rg.expiry = from.Add(time.Duration(kg.GetValidMs()) * time.Millisecond)
				rg.issued = from
				logf("%s installs %.4g/s burst %.4g until %.3fs", ccRegions[e.region], rg.rate, rg.burst, rg.expiry.Sub(start).Seconds())
				push(&ccEvent{at: rg.expiry, kind: ccExpire, region: e.region})
			}
			next := now.Add(epoch + delay("nextReport"))
			if ms := g.GetReportAgainMs(); ms > 0 {
				next = now.Add(time.Duration(ms) * time.Millisecond)
			}
			push(&ccEvent{at: next, kind: ccSend, region: e.region})
		}
		check()
	}
}
