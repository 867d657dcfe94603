package live

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/sim/oracle"
)

// traceEvents bounds the events kept per key: a whole run's reports,
// answers and applied grants of three regions (a few per second each), so
// a violation found early in a run still has its events when they are
// printed at its end.
const traceEvents = 16384

// keyTrace keeps, per key, the latest grant events of every region: the
// reports that echo what the region holds, the global tier's answers and
// the grants the region leaders applied. When invariant 2 or 3 fails, the
// first violating key's events before that instant are printed, so a
// failure on a loaded machine can be read after the fact. Safe for
// concurrent use.
type keyTrace struct {
	mu     sync.Mutex // guards events
	events map[int][]traceEvent
}

type traceEvent struct {
	at     time.Time
	region int
	what   string
}

func (kt *keyTrace) add(key, region int, at time.Time, what string) {
	kt.mu.Lock()
	defer kt.mu.Unlock()
	if kt.events == nil {
		kt.events = map[int][]traceEvent{}
	}
	ev := append(kt.events[key], traceEvent{at, region, what})
	if len(ev) > traceEvents {
		ev = ev[len(ev)-traceEvents:]
	}
	kt.events[key] = ev
}

// dump writes key's events from scenario time from to until (virtual maps
// a wall time to scenario time), one per line.
func (kt *keyTrace) dump(w io.Writer, key int, regions []string, virtual func(time.Time) time.Duration, from, until time.Duration) {
	kt.mu.Lock()
	defer kt.mu.Unlock()
	for _, e := range kt.events[key] {
		if at := virtual(e.at); at >= from && at <= until {
			fmt.Fprintf(w, "  %9.3fs %-9s %s\n", at.Seconds(), regions[e.region], e.what)
		}
	}
}

// keyOf is the plan's index of a key named on the wire.
func (d *deployment) keyOf(k *sluicev1.QuotaKey) (int, bool) {
	id, ok := d.keyID[quota.Key{Tenant: k.GetTenant(), Class: k.GetClass()}]
	return id, ok
}

// scenarioMs is a wall duration in ms as scenario ms.
func (d *deployment) scenarioMs(ms int64) int64 { return int64(float64(ms) * d.scale) }

// traceReport records what a report says of each key it names.
// tier numbers the replica's way to the global tier that sent it.
func (d *deployment) traceReport(region, tier int, r *sluicev1.RegionReport) {
	now := time.Now()
	for _, kd := range r.GetKeys() {
		key, ok := d.keyOf(kd.GetKey())
		if !ok {
			continue
		}
		d.trace.add(key, region, now, fmt.Sprintf("report seq %d (tier #%d): holds %.4g/s burst %.4g for %d ms, admitted %d in %d ms, revisions %v",
			r.GetSeq(), tier, kd.GetHeldRate()/d.scale, kd.GetHeldBurst(), d.scenarioMs(kd.GetHeldValidMs()), kd.GetAdmitted(), d.scenarioMs(kd.GetWindowMs()), r.GetConfigRevisions()))
	}
}

// traceAnswer records the global tier's answer to a report, or its loss.
func (d *deployment) traceAnswer(region, tier int, r *sluicev1.RegionReport, g *sluicev1.RegionGrants, err error) {
	now := time.Now()
	if err != nil {
		for _, kd := range r.GetKeys() {
			if key, ok := d.keyOf(kd.GetKey()); ok {
				d.trace.add(key, region, now, fmt.Sprintf("answer to seq %d (tier #%d) lost: %v", r.GetSeq(), tier, err))
			}
		}
		return
	}
	var view *hierarchy.View
	for _, gr := range g.GetGrants() {
		k := quota.Key{Tenant: gr.GetKey().GetTenant(), Class: gr.GetKey().GetClass()}
		key, ok := d.keyID[k]
		if !ok {
			continue
		}
		if view == nil {
			view = d.leaderView(now)
		}
		d.trace.add(key, region, now, fmt.Sprintf("answer to seq %d (tier #%d): %.4g/s burst %.4g for %d ms (epoch %d, learning %v, static lease %d ms, confirmed %d/%v)%s",
			r.GetSeq(), tier, gr.GetRate()/d.scale, gr.GetBurst(), d.scenarioMs(gr.GetValidMs()), g.GetEpoch(), g.GetLearning(), d.scenarioMs(g.GetStaticLeaseMs()),
			g.GetConfirmedRevision(), g.GetConfirmedKnown(), d.reserved(view, k)))
	}
}

// leaderView is the leading global daemon's allocator view at now (nil
// when none leads).
func (d *deployment) leaderView(now time.Time) *hierarchy.View {
	d.globalMu.Lock()
	globals := slices.Clone(d.globals)
	d.globalMu.Unlock()
	for _, g := range globals {
		if g.IsLeader() {
			v := g.Service.View(now)
			return &v
		}
	}
	return &hierarchy.View{}
}

// reserved says what the global leader's fencing assumed each region may
// use of k just after it answered: "; leader reserves us-east 5/s until
// … (static 5/s, granted …)", in scenario units.
func (d *deployment) reserved(v *hierarchy.View, k quota.Key) string {
	i := slices.IndexFunc(v.Keys, func(kv hierarchy.KeyView) bool { return kv.Key == k })
	if i < 0 || len(v.Keys[i].Regions) != len(v.Regions) {
		return ""
	}
	var b strings.Builder
	b.WriteString("; leader reserves")
	for j, rv := range v.Keys[i].Regions {
		fmt.Fprintf(&b, " %s %.4g/s (static %.4g/s", v.Regions[j].Name, rv.ReservedRate/d.scale, rv.StaticRate/d.scale)
		if rv.GrantedRate > 0 && d.rec != nil {
			fmt.Fprintf(&b, ", granted %.4g/s until %.3fs", rv.GrantedRate/d.scale, d.rec.virtual(rv.GrantExpiry).Seconds())
		}
		b.WriteString(")")
	}
	return b.String()
}

// dumpViolation writes, when sc failed, the first violating key's events
// from three grant validities before the violation to an epoch after it.
func (d *deployment) dumpViolation(w io.Writer, invariant string, sc oracle.SumCheck) {
	if sc.Violations == 0 {
		return
	}
	key := -1
	for k, id := range d.keyID {
		if k.String() == sc.FirstKey {
			key = id
		}
	}
	if key < 0 {
		return
	}
	names := make([]string, len(d.regions))
	for _, r := range d.regions {
		names[r.idx] = r.name
	}
	validity, epoch := time.Duration(d.sc.Config.GrantValidity), time.Duration(d.sc.Config.Epoch)
	fmt.Fprintf(w, "live: invariant %s first broken by %s at %.3fs; its grant events before (scenario time and units):\n",
		invariant, sc.FirstKey, sc.FirstAt.Seconds())
	d.trace.dump(w, key, names, d.rec.virtual, sc.FirstAt-3*validity, sc.FirstAt+epoch)
}
