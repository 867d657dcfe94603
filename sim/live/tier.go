package live

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/regional"
)

var errInjected = errors.New("injected fault: the global tier is unreachable from this region")

// tierFaults are the faults injected between one region and the global
// tier: partitions, extra latency and loss. Safe for concurrent use.
type tierFaults struct {
	mu          sync.Mutex // guards the fields below
	partitioned bool
	delay       time.Duration // extra one-way latency
	loss        float64
	rng         *rand.Rand
}

// faultyTier is one region leader's way to the global tier, subject to its
// region's faults.
type faultyTier struct {
	next regional.GlobalTier
	f    *tierFaults
}

func (ft *faultyTier) Sync(ctx context.Context, r *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	f := ft.f
	f.mu.Lock()
	cut, delay := f.partitioned, f.delay
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
