package allocator

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/pkg/config"
)

// plainSource is a ConfigSource with no revisions (every config runs
// revision 0) that a test changes.
type plainSource struct {
	mu  sync.Mutex
	cfg *config.Config
}

func (p *plainSource) Current() *config.Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg
}

func (p *plainSource) set(cfg *config.Config) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg = cfg
}

// reshardRig drives a Service of loopConfig (epoch 100ms, validity 500ms,
// regions a and b) inside a synctest bubble.
type reshardRig struct {
	t   *testing.T
	s   *Service
	seq map[string]uint64
}

const reshardEpoch, reshardValidity = 100 * time.Millisecond, 500 * time.Millisecond

// report has region report revs (nil: no revisions) and says whether the
// answer was learning.
func (r *reshardRig) report(region string, revs ...int64) bool {
	r.t.Helper()
	r.seq[region]++
	g, err := r.s.Sync(r.t.Context(), &sluicev1.RegionReport{Region: region, Seq: r.seq[region], ConfigRevisions: revs})
	if err != nil {
		r.t.Fatal(err)
	}
	return g.GetLearning()
}

// learnsFor has region report revs every epoch until an answer is not
// learning, and returns how long that took (failing past ten learning
// periods).
func (r *reshardRig) learnsFor(region string, revs ...int64) time.Duration {
	r.t.Helper()
	start := time.Now()
	for r.report(region, revs...) {
		if time.Since(start) > 10*(reshardValidity+reshardEpoch) {
			r.t.Fatalf("%s reporting %v: still learning after %v", region, revs, time.Since(start))
		}
		time.Sleep(reshardEpoch)
	}
	return time.Since(start)
}

// keepsLearning has region report revs every epoch for three learning
// periods (one validity and one epoch each), every answer learning.
func (r *reshardRig) keepsLearning(why, region string, revs ...int64) {
	r.t.Helper()
	start := time.Now()
	for time.Since(start) <= 3*(reshardValidity+reshardEpoch) {
		if !r.report(region, revs...) {
			r.t.Fatalf("not learning %v after %s, %s reporting %v", time.Since(start), why, region, revs)
		}
		time.Sleep(reshardEpoch)
	}
}

// endsWithin fails unless learning, with region reporting revs, ends one
// validity and one epoch after the first of those reports (the answers
// are an epoch apart).
func (r *reshardRig) endsWithin(why, region string, revs ...int64) {
	r.t.Helper()
	if took := r.learnsFor(region, revs...); took < reshardValidity || took > reshardValidity+2*reshardEpoch {
		r.t.Fatalf("learning ended %v after %s, want one validity and one epoch (%v)", took, why, reshardValidity+reshardEpoch)
	}
}

func newReshardRig(t *testing.T, src ConfigSource) *reshardRig {
	s := quietService(t, src)
	return &reshardRig{t: t, s: s, seq: map[string]uint64{}}
}

// TestReshardLearningWithoutRevisionsWaitsForEveryRegion: with a config
// source that has no revisions, a leader that sees global_shards change
// learns until every region has reported since it leads, and one grant
// validity and one epoch more: a region it has not heard from may run the
// old count.
func TestReshardLearningWithoutRevisionsWaitsForEveryRegion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &plainSource{cfg: parseConfig(t, loopConfig)}
		r := newReshardRig(t, src)
		r.s.promote(1, time.Now().Add(time.Hour), nil)
		if took := r.learnsFor("a", 0); took > reshardValidity {
			t.Fatalf("with one shard count, learning lasted %v, past its election's %v", took, reshardValidity)
		}
		src.set(parseConfig(t, loopConfig+"global_shards: 2\n"))
		r.keepsLearning("global_shards changed, b never reporting", "a", 0)
		r.report("b", 0)
		r.endsWithin("b reported too", "a", 0)
	})
}

// TestReshardLearningWhileARegionMayRunAnOlderCount: a leader that first
// sees the shard count at revision 6 learns while some region may still
// run an older one: while it holds the config of revision 5 with another
// count (seen while standing by) and a region still reports 5, or while a
// region's newest reported revision is older than 6 (whatever count that
// revision had); each time until one validity and one epoch after that
// stops.
func TestReshardLearningWhileARegionMayRunAnOlderCount(t *testing.T) {
	t.Run("held config of another count", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			src := configtest.NewSource(parseConfig(t, loopConfig), 5)
			r := newReshardRig(t, src)
			// Standing by, the replica applies revision 6, which raises
			// the count, then leads.
			src.Set(parseConfig(t, loopConfig+"global_shards: 2\n"), 6)
			r.s.step(time.Now())
			r.s.promote(1, time.Now().Add(time.Hour), nil)
			r.keepsLearning("leading with revisions 5 and 6 held, b never reporting", "a", 5, 6)
			r.report("b", 6) // revision 6 confirmed: revision 5 is no longer held
			r.endsWithin("every region reported revision 6", "a", 5, 6)
		})
	})
	t.Run("region reporting only an older revision", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			src := configtest.NewSource(parseConfig(t, loopConfig+"global_shards: 2\n"), 6)
			r := newReshardRig(t, src)
			r.s.promote(1, time.Now().Add(time.Hour), nil)
			r.report("b", 6)
			r.keepsLearning("a reports only revision 5", "a", 5)
			r.endsWithin("a reports revision 6", "a", 6)
		})
	})
}

// TestReshardLearningEndsOneValidityAndOneEpochAfter: when every region
// already runs the config of the new count (no revisions: each has
// reported since this leader leads), learning ends one validity and one
// epoch after the leader sees global_shards change, as the failure table
// says, not a validity later: the learning the change starts is extended,
// not started again when the allocator's own validity of learning ends.
func TestReshardLearningEndsOneValidityAndOneEpochAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &plainSource{cfg: parseConfig(t, loopConfig)}
		r := newReshardRig(t, src)
		r.s.promote(1, time.Now().Add(time.Hour), nil)
		r.report("b", 0)
		r.learnsFor("a", 0)
		src.set(parseConfig(t, loopConfig+"global_shards: 2\n"))
		r.endsWithin("global_shards changed with every region heard", "a", 0)
		src.set(parseConfig(t, loopConfig+"global_shards: 3\n"))
		r.endsWithin("global_shards changed again", "a", 0)
	})
}
