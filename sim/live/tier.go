package live

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/regional"
)

var errInjected = errors.New("injected fault: the global tier is unreachable from this region")

// tierFaults are the faults injected between one region and the global
// tier: partitions, extra latency, loss and reports delivered twice
// (region-report-replay). Safe for concurrent use.
type tierFaults struct {
	mu          sync.Mutex // guards the fields below
	partitioned bool
	delay       time.Duration // extra one-way latency
	loss        float64
	replay      bool // every answered report is delivered again at once
	rng         *rand.Rand

	// replays counts reports delivered again, mismatches those the
	// global tier answered differently from the first time (a retry must
	// get the same answer and change nothing).
	replays, mismatches atomic.Int64
	firstMismatch       string // guarded by mu: the first report answered differently, and both answers
}

// faultyTier is one region leader's way to the global tier, subject to its
// region's faults.
type faultyTier struct {
	next regional.GlobalTier
	f    *tierFaults
	// sending, optional, sees every report the region leader sends,
	// before anything is done to it.
	sending func(r *sluicev1.RegionReport)
	// answered, optional, sees what became of every report the global
	// tier was reached with: its answer, or the error.
	answered func(r *sluicev1.RegionReport, g *sluicev1.RegionGrants, err error)
}

func (ft *faultyTier) Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	if ft.sending != nil {
		ft.sending(r)
	}
	f := ft.f
	f.mu.Lock()
	cut, delay, replay := f.partitioned, f.delay, f.replay
	lost := f.loss > 0 && f.rng.Float64() < f.loss
	f.mu.Unlock()
	if cut || lost {
		<-ctx.Done() // as a dropped packet: the caller's deadline ends it
		return nil, errInjected
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	g, err := ft.next.Sync(ctx, r)
	if ft.answered != nil {
		ft.answered(r, g, err)
	}
	if err == nil && replay {
		// The same report again, as a retry of one whose answer the
		// region already has: its answer must be the first's.
		again, aerr := ft.next.Sync(ctx, r)
		// Only an answer from the same allocator in the same epoch is
		// held to the first: a leader that took over meanwhile (the
		// machine starved the old one of its session) never saw the
		// report and rightly answers it anew.
		if aerr == nil && again.GetEpoch() == g.GetEpoch() {
			f.replays.Add(1)
			if !sameGrants(again, g) && f.mismatches.Add(1) == 1 {
				f.mu.Lock()
				f.firstMismatch = fmt.Sprintf("report %v\nfirst answer %v\nagain %v", r, g, again)
				f.mu.Unlock()
			}
		}
	}
	if err != nil || delay == 0 {
		return g, err
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return g, nil
	}
}

func (f *tierFaults) set(fn func(f *tierFaults)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// Watch passes the global leader's nudges through, except while the region
// is cut off or when the link loses them (a nudge only hastens a report).
func (ft *faultyTier) Watch(ctx context.Context, region string, retry time.Duration, nudge func()) {
	n, ok := ft.next.(regional.Nudger)
	if !ok {
		return
	}
	n.Watch(ctx, region, retry, func() {
		f := ft.f
		f.mu.Lock()
		drop := f.partitioned || (f.loss > 0 && f.rng.Float64() < f.loss)
		f.mu.Unlock()
		if !drop {
			nudge()
		}
	})
}

// sameGrants reports whether a retried report's answer repeats the first:
// the same grants for the same report. What the answer says of the
// moment it is given (learning, when to report again, the static lease
// decided anew, the confirmed revision) may move between the two calls
// here, which the virtual simulator makes at one instant.
func sameGrants(a, b *sluicev1.RegionGrants) bool {
	if a.GetRegion() != b.GetRegion() || a.GetSeq() != b.GetSeq() || len(a.GetGrants()) != len(b.GetGrants()) {
		return false
	}
	for i, g := range a.GetGrants() {
		if !proto.Equal(g, b.GetGrants()[i]) {
			return false
		}
	}
	return true
}
