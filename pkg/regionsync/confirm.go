package regionsync

import (
	"iter"
	"math"
	"slices"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// MaxConfigs bounds the config_revisions of a report: the confirmed
// revision and the newest MaxConfigs-1 adopted since.
const MaxConfigs = 8

// MaxChain bounds the configs a Chain lists (the confirmed one and those
// adopted since). It is larger than a report, so that a region whose
// listed configs the other regions never ran (they skipped those
// revisions) still reports the config it runs, and that one can be
// confirmed: a revision leaves the reports before it leaves the chain.
const MaxChain = 2 * MaxConfigs

// Revision is one config and the etcd mod revision it came from (0 for a
// static config).
type Revision struct {
	Rev int64
	Cfg *config.Config
}

// Chain is the make-before-break discipline of static shares on a region's
// side. A weight or limit change reaches regions at different times (a
// region cut off from etcd keeps the old config), so a region must not
// raise a static share before every region applies the decreases that pay
// for it. A Chain holds the config the global tier last confirmed to the
// region and every config adopted since, in adoption order; the static
// share the region hands its scripts is the smallest share among them
// (Share). A decrease thus applies at once, an increase only once the
// global tier confirms a revision every region reported (Confirm).
//
// Why that is safe: the global tier confirms X only when X is among the
// reported revisions of every region, and a region drops a reported
// revision only when told of a confirmed one adopted after it (a report
// leaves out the listed revisions between the confirmed one and the newest
// MaxConfigs-1, which are still held: they can still be confirmed on an
// earlier report, and they still bound Share). So the
// newest revision ever confirmed is at every instant still in every
// region's chain, every region's share is at most its share under that one
// config, and those sum to at most the key's rate and burst. Exact matching
// of revisions (not "at most X") keeps this true when a region skipped a
// revision the others ran (a watch resumed after a compaction).
//
// A Chain is a value: its methods return a new Chain and never change the
// receiver, so an adapter may publish it through an atomic pointer. Safe
// for concurrent use as long as no one modifies its configs.
type Chain struct {
	entries []chainEntry // [0] confirmed; the rest adopted since, oldest first; at most MaxChain
	// unlisted is the config run when the chain is full: it counts in
	// Share but is not reported (and so never confirmed) until room frees.
	unlisted *Revision
}

type chainEntry struct {
	Revision
	reported bool // it went out in some report: it stays until a confirmation passes it
}

// NewChain is a chain whose confirmed config is cfg at rev, with nothing
// adopted since: a region's chain at start when it knows no history
// (StartChain).
func NewChain(rev int64, cfg *config.Config) Chain {
	return Chain{entries: []chainEntry{{Revision: Revision{Rev: rev, Cfg: cfg}}}}
}

// NeedsHistory says whether a process starting on the config of revision
// live must read the config of revision confirmed, the one its region's
// leader stored as last confirmed to the region (0: none stored), to start
// its chain (StartChain): only when both are etcd revisions and differ.
func NeedsHistory(confirmed, live int64) bool {
	return confirmed > 0 && live > 0 && confirmed != live
}

// StartChain is the chain a process starts with: live is the config it
// starts on; history is what it read of its region's history, oldest
// first: the config of the revision last confirmed to the region, as the
// region's leader stored it, then those committed after it and before
// live (the region may have run one of them and seen it confirmed
// without storing that yet). When it needs that history (NeedsHistory)
// and has the confirmed config, the chain is that one confirmed and the
// later ones and live adopted since, as for a process that ran through
// the changes: its static shares are the smallest under them until a
// confirmation passes them. Otherwise live counts as confirmed: right for
// a fresh region, a static config, or a process starting on the
// confirmed config itself; the residual gap of docs/architecture.md when
// the history is unknown (Redis lost it, etcd compacted it). history
// holds at most MaxChain-1 configs (more fill the chain: the newest ones
// then replace each other).
func StartChain(history []Revision, live Revision) Chain {
	if len(history) == 0 || history[0].Cfg == nil || !NeedsHistory(history[0].Rev, live.Rev) {
		return NewChain(live.Rev, live.Cfg)
	}
	c := NewChain(history[0].Rev, history[0].Cfg)
	for _, e := range history[1:] {
		if e.Cfg != nil && e.Rev != live.Rev {
			c = c.Adopt(e.Rev, e.Cfg)
		}
	}
	return c.Adopt(live.Rev, live.Cfg)
}

// Current is the config the region runs (the newest adopted).
func (c Chain) Current() Revision {
	if c.unlisted != nil {
		return *c.unlisted
	}
	if len(c.entries) == 0 {
		return Revision{}
	}
	return c.entries[len(c.entries)-1].Revision
}

// Confirmed is the revision of the config last confirmed to the region.
func (c Chain) Confirmed() int64 {
	if len(c.entries) == 0 {
		return 0
	}
	return c.entries[0].Rev
}

// Len is how many configs count in Share.
func (c Chain) Len() int {
	n := len(c.entries)
	if c.unlisted != nil {
		n++
	}
	return n
}

// Adopt is c after the region adopted cfg at rev (the config watcher made
// it live). The same revision again changes nothing. When the chain is
// full (MaxChain), cfg replaces the newest config if that one was never
// reported (nobody can confirm it), or else runs unlisted: it still counts
// in Share but is not reported until a confirmation frees room. A reported
// revision is never dropped before a confirmation passes it.
func (c Chain) Adopt(rev int64, cfg *config.Config) Chain {
	if cur := c.Current(); cur.Cfg != nil && cur.Rev == rev {
		return c
	}
	e := chainEntry{Revision: Revision{Rev: rev, Cfg: cfg}}
	out := Chain{entries: slices.Clone(c.entries)}
	if len(out.entries) < MaxChain {
		out.entries = append(out.entries, e)
		return out
	}
	if last := &out.entries[len(out.entries)-1]; len(out.entries) > 1 && !last.reported {
		*last = e
		return out
	}
	out.unlisted = &e.Revision
	return out
}

// Reported is the revisions to send (oldest first), at most MaxConfigs:
// the confirmed one and the newest MaxConfigs-1 listed, the config the
// region runs among them whenever it is listed; and c with those marked as
// reported. Call it for each report, and publish the returned chain before
// the report leaves.
func (c Chain) Reported() (Chain, []int64) {
	out := Chain{entries: slices.Clone(c.entries), unlisted: c.unlisted}
	n := len(out.entries)
	revs := make([]int64, 0, min(n, MaxConfigs))
	for i := range out.entries {
		if i > 0 && i < n-(MaxConfigs-1) {
			continue // held, and still bounding Share, but not sent
		}
		out.entries[i].reported = true
		revs = append(revs, out.entries[i].Rev)
	}
	return out, revs
}

// Confirm is c after the global tier confirmed rev: when rev is one of the
// listed revisions, the older ones are dropped and rev becomes the
// confirmed config (an unlisted config is listed if room freed). A
// revision not listed (older than the confirmed one, or one this process
// never ran) changes nothing.
func (c Chain) Confirm(rev int64) Chain {
	at := -1
	for i, e := range c.entries {
		if e.Rev == rev && e.Cfg != nil {
			at = i
		}
	}
	if at <= 0 {
		return c
	}
	out := Chain{entries: slices.Clone(c.entries[at:])}
	out.entries[0].reported = true
	if c.unlisted != nil {
		out = out.Adopt(c.unlisted.Rev, c.unlisted.Cfg)
	}
	return out
}

// Share is the static rate and burst the region may use for a key: the
// smallest share among cfg (the config a request is served under, res the
// key resolved there) and the chain's configs, the key resolved under each.
// A config under which the key does not resolve, or which lacks the
// region, counts as a share of 0 (regions still running it serve nothing
// there, but no other config bounds what they may run later).
func (c Chain) Share(region string, k quota.Key, cfg *config.Config, res config.Resolved) (rate, burst float64, err error) {
	rate, burst, err = cfg.StaticShareOf(region, res)
	if err != nil {
		return 0, 0, err
	}
	c.each(func(e Revision) {
		if e.Cfg == cfg {
			return
		}
		r, b := ShareUnder(e.Cfg, region, k)
		rate, burst = math.Min(rate, r), math.Min(burst, b)
	})
	return rate, burst, nil
}

// Awaiting says whether the region's static burst for k is 0 only for want
// of a confirmation, not a floor (luascripts.Common.AwaitingShare): cfg,
// the config the request is served under (res the key resolved there),
// gives the key a positive burst share in region, and so does every config
// of the chain that knows the key's class and the region, while at least
// one config of the chain knows neither the class nor the region (one
// added since the confirmed revision) and so makes Share 0. Nothing the
// global tier may count the region at for k is then below what the region
// will run once the newer config is confirmed: no config drains it to a
// floor of 0 or gives it no whole unit of the burst. Meaningful only for a
// region on its static shares (OnStatic, or a region with no global tier):
// off its lease the region runs its floor, whatever the chain says.
func (c Chain) Awaiting(region string, k quota.Key, cfg *config.Config, res config.Resolved) bool {
	if _, b, err := cfg.StaticShareOf(region, res); err != nil || !(b > 0) {
		return false
	}
	unknown, positive := false, true
	c.each(func(e Revision) {
		if e.Cfg == cfg || !positive {
			return
		}
		if e.Cfg != nil {
			_, hasRegion := e.Cfg.Regions[region]
			_, hasClass := e.Cfg.Classes[k.Class]
			if !hasRegion || !hasClass {
				unknown = true
				return
			}
		}
		if _, b := ShareUnder(e.Cfg, region, k); !(b > 0) {
			positive = false
		}
	})
	return unknown && positive
}

// each calls f for every config that counts in Share.
func (c Chain) each(f func(Revision)) {
	for _, e := range c.entries {
		f(e.Revision)
	}
	if c.unlisted != nil {
		f(*c.unlisted)
	}
}

// ShareUnder is region's static rate and burst for k under cfg, 0 when k
// does not resolve there or the region is not in it.
func ShareUnder(cfg *config.Config, region string, k quota.Key) (rate, burst float64) {
	if cfg == nil {
		return 0, 0
	}
	res, err := cfg.Resolve(k)
	if err != nil {
		return 0, 0
	}
	r, b, err := cfg.StaticShareOf(region, res)
	if err != nil {
		return 0, 0
	}
	return r, b
}

// Confirmations is the global tier's side: the revisions each region last
// reported, the revision it counts every region's share under, and the
// revision it confirmed. Not safe for concurrent use.
//
// A confirmation goes in two steps (docs/architecture.md, "Static shares
// that change: make before break"). A region raises its static share the
// moment it learns of a confirmation, and a region holding no grant of a
// key (none issued, or its set_rate lost) runs that share at once. So
// from the moment every region reports a revision the global tier holds,
// it counts each region at its share under that revision and the later
// ones it reported (Assumed, Reserve), and it confirms the revision only
// once every grant sized before that moment has ended: one validity and
// epoch later (Advance). Confirming at once sized the others' grants with
// a restored region at its floor while the region already ran its share.
type Confirmations struct {
	reported  map[string][]int64 // region -> its latest report's config_revisions
	confirmed int64
	known     bool
	// assumed is the newest revision every counted region reported and
	// the global tier held at some Advance: from then on each region is
	// counted at its share under it (Reserve). Never decreases.
	assumed      int64
	assumedKnown bool
	// pending are the assumed revisions not confirmed yet, oldest first,
	// with when each was first assumed; at most MaxConfigs.
	pending []pendingRevision
	// holds says whether the global tier holds a revision's config; nil:
	// every revision. Only a held revision is assumed and confirmed.
	holds func(rev int64) bool
}

type pendingRevision struct {
	rev   int64
	since time.Time
}

// NewConfirmations starts with nothing confirmed. holds (optional) says
// whether the global tier holds the config of a revision: only such a
// revision is assumed and confirmed. A region raises its share on the
// confirmation at once, and the global tier sizes the others' grants with
// the region's share under the revisions it holds; confirming a revision
// whose config it does not hold (its watch behind the regions', or a
// config read back from etcd not landed yet) would let a restored region
// run its share beside grants that counted it at its floor.
func NewConfirmations(holds func(rev int64) bool) *Confirmations {
	return &Confirmations{reported: map[string][]int64{}, holds: holds}
}

// Observe records region's latest config_revisions (at most MaxConfigs;
// longer lists are cut to their newest MaxConfigs). It reports whether
// they changed.
func (c *Confirmations) Observe(region string, revs []int64) bool {
	if len(revs) > MaxConfigs {
		revs = revs[len(revs)-MaxConfigs:]
	}
	if slices.Equal(c.reported[region], revs) {
		if _, ok := c.reported[region]; ok {
			return false
		}
	}
	c.reported[region] = slices.Clone(revs)
	return true
}

// Forget drops a region's reports (it left the config).
func (c *Confirmations) Forget(region string) { delete(c.reported, region) }

// Reported is region's latest config_revisions (nil, false when it never
// reported).
func (c *Confirmations) Reported(region string) ([]int64, bool) {
	r, ok := c.reported[region]
	return r, ok
}

// Counted says whether a configured region must have reported a revision
// before it is confirmed. Every configured region counts, heard from or
// not: a region never heard from may run anything. Once regions can be
// declared dead (their static share a lease that lapsed), this is where
// they stop counting.
func Counted(region string) bool { return true }

// common is the revisions every counted region of regions has among its
// latest reported revisions and whose config is held (ok false while some
// counted region never reported).
func (c *Confirmations) common(regions []string) (revs []int64, ok bool) {
	first := true
	for _, r := range regions {
		if !Counted(r) {
			continue
		}
		reported, heard := c.reported[r]
		if !heard {
			return nil, false
		}
		if first {
			revs, first = slices.Clone(reported), false
			continue
		}
		revs = slices.DeleteFunc(revs, func(x int64) bool { return !slices.Contains(reported, x) })
	}
	if c.holds != nil {
		revs = slices.DeleteFunc(revs, func(x int64) bool { return !c.holds(x) })
	}
	return revs, !first
}

// Advance moves the two steps of a confirmation on at now, for the
// configured regions, and returns the confirmed revision (ok false while
// there is none). The newest revision every counted region has among its
// latest reported revisions, held by the global tier, is assumed from now
// on (Assumed, Reserve). An assumed revision is confirmed once it has been
// assumed for wait and now is not before notBefore, or at once when every
// counted region reports it as the revision last confirmed to it (the
// first of its revisions: the confirmation changes no region's share), if
// every counted region still reports it; the newest such one wins, and the
// confirmed revision never goes back.
//
// wait must cover every grant issued before the revision was assumed: the
// grant validity (the longest any grant still in force was issued with)
// plus an epoch for clock rates. notBefore is when grants an earlier
// allocator issued, perhaps with a longer validity, have surely ended
// (zero: none). With wait 0 and a zero notBefore a revision is confirmed
// the moment every region reports it.
func (c *Confirmations) Advance(now time.Time, regions []string, wait time.Duration, notBefore time.Time) (rev int64, ok bool) {
	common, heard := c.common(regions)
	if !heard || len(common) == 0 {
		return c.confirmed, c.known
	}
	if best := slices.Max(common); (!c.assumedKnown || best > c.assumed) && (!c.known || best > c.confirmed) {
		c.assumed, c.assumedKnown = best, true
		c.pending = append(c.pending, pendingRevision{rev: best, since: now})
		if len(c.pending) > MaxConfigs {
			c.pending = slices.Delete(c.pending, 0, len(c.pending)-MaxConfigs)
		}
	}
	settled := !now.Before(notBefore)
	for i := len(c.pending) - 1; i >= 0; i-- {
		p := c.pending[i]
		if !slices.Contains(common, p.rev) || !(settled && now.Sub(p.since) >= wait || c.confirmedByAll(regions, p.rev)) {
			continue
		}
		if !c.known || p.rev > c.confirmed {
			c.confirmed, c.known = p.rev, true
		}
		c.pending = slices.Delete(c.pending, 0, i+1)
		break
	}
	return c.confirmed, c.known
}

// confirmedByAll says whether every counted region reports rev first, as
// the revision last confirmed to it (Chain.Reported): confirming it again
// changes no region's chain, so it needs no wait (a leader that just took
// over, regions on one config).
func (c *Confirmations) confirmedByAll(regions []string, rev int64) bool {
	for _, r := range regions {
		if revs := c.reported[r]; Counted(r) && (len(revs) == 0 || revs[0] != rev) {
			return false
		}
	}
	return true
}

// Step is Advance for a global tier serving a report: it says which of the
// assumed and the confirmed revision moved (either changes the reserves
// and the configs still in play).
func (c *Confirmations) Step(now time.Time, regions []string, wait time.Duration, notBefore time.Time) (assumedMoved, confirmedMoved bool) {
	a, aKnown := c.Assumed()
	r, rKnown := c.Confirmed()
	c.Advance(now, regions, wait, notBefore)
	a2, aKnown2 := c.Assumed()
	r2, rKnown2 := c.Confirmed()
	return a2 != a || aKnown2 != aKnown, r2 != r || rKnown2 != rKnown
}

// Confirmed is the confirmed revision as the last Advance left it (ok
// false while there is none).
func (c *Confirmations) Confirmed() (rev int64, ok bool) { return c.confirmed, c.known }

// Assumed is the revision from which the global tier counts each region's
// static share (Reserve): the newest one every region reported and the
// global tier held at some Advance, confirmed or still waiting; never
// older than the confirmed one (ok false while there is none).
func (c *Confirmations) Assumed() (rev int64, ok bool) {
	if c.known && (!c.assumedKnown || c.confirmed > c.assumed) {
		return c.confirmed, true
	}
	return c.assumed, c.assumedKnown
}

// Reserve is what the global tier must assume a region may use as its
// static share of k, now and until any grant issued now ends: the
// smallest share under the region's reported revisions from the assumed
// one on (it keeps them all until a later confirmation, and the assumed
// one may be confirmed while such a grant runs), taking only revisions
// whose config cfgs holds. A region
// never heard from, or none of whose revisions are held, may run any
// config: the largest share under any held config. cfgs must hold at
// least one config.
func (c *Confirmations) Reserve(cfgs map[int64]*config.Config, region string, k quota.Key) (rate, burst float64) {
	return c.ReserveOf(cfgs, region, func(cfg *config.Config) (float64, float64) { return ShareUnder(cfg, region, k) })
}

// ReserveOf is Reserve for any per-config amount a region runs the
// smallest of under the configs it honours (its static share, its floor):
// the smallest of amount under region's revisions in play whose config
// cfgs holds, or, none held, the largest under any held config.
func (c *Confirmations) ReserveOf(cfgs map[int64]*config.Config, region string, amount func(*config.Config) (rate, burst float64)) (rate, burst float64) {
	found := false
	for rev := range c.InPlay(region) {
		cfg, held := cfgs[rev]
		if !held {
			continue
		}
		r, b := amount(cfg)
		if !found {
			rate, burst, found = r, b, true
		} else {
			rate, burst = math.Min(rate, r), math.Min(burst, b)
		}
	}
	if found {
		return rate, burst
	}
	for _, cfg := range cfgs {
		r, b := amount(cfg)
		rate, burst = math.Max(rate, r), math.Max(burst, b)
	}
	return rate, burst
}

// Unheld is the revisions of region's latest report that Reserve would
// take were their configs in cfgs, and which cfgs lacks: etcd revisions
// (> 0) not older than the assumed one, oldest first. While they are
// not held, region's reserve is the smallest share under its held
// revisions, or, with none held, the largest share under any held
// config, which can be below its share under the revision it runs; the
// global tier reads their configs back (docs/architecture.md, "Static
// shares that change: make before break").
func (c *Confirmations) Unheld(cfgs map[int64]*config.Config, region string) []int64 {
	var out []int64
	for rev := range c.InPlay(region) {
		if _, held := cfgs[rev]; held || rev <= 0 {
			continue
		}
		out = append(out, rev)
	}
	return out
}

// InPlay yields region's latest reported revisions not older than the
// assumed one, oldest first: those a region may still run until a later
// confirmation, and the only ones the global tier counts it under
// (Reserve; pkg/allocator's floors and drain checks likewise). Nothing
// for a region never heard from.
func (c *Confirmations) InPlay(region string) iter.Seq[int64] {
	return func(yield func(int64) bool) {
		from, known := c.Assumed()
		for _, rev := range c.reported[region] {
			if known && rev < from {
				continue
			}
			if !yield(rev) {
				return
			}
		}
	}
}

// Answered is c after the global tier's answer g (its confirmed revision,
// when it has one).
func (c Chain) Answered(g *sluicev1.RegionGrants) Chain {
	if !g.GetConfirmedKnown() {
		return c
	}
	return c.Confirm(g.GetConfirmedRevision())
}
