package allocator

import (
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// nudgeHub delivers the allocator's nudges (hierarchy.Allocator.TakeNudges)
// to the Watch streams of the regions named. A nudge is a wake-up, not a
// message: each stream holds at most one pending, so a slow region cannot
// make the leader queue anything, and nothing is lost but timing when one
// is dropped. Safe for concurrent use.
type nudgeHub struct {
	mu   sync.Mutex                            // guards subs
	subs map[string]map[chan struct{}]struct{} // region -> pending-nudge channels
}

// subscribe registers a stream of region; cancel unregisters it.
func (h *nudgeHub) subscribe(region string) (ch chan struct{}, cancel func()) {
	ch = make(chan struct{}, 1)
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[string]map[chan struct{}]struct{}{}
	}
	if h.subs[region] == nil {
		h.subs[region] = map[chan struct{}]struct{}{}
	}
	h.subs[region][ch] = struct{}{}
	h.mu.Unlock()
	return ch, func() {
		h.mu.Lock()
		delete(h.subs[region], ch)
		if len(h.subs[region]) == 0 {
			delete(h.subs, region)
		}
		h.mu.Unlock()
	}
}

// nudge wakes every stream of every region named. It never blocks.
func (h *nudgeHub) nudge(regions []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range regions {
		for ch := range h.subs[r] {
			select {
			case ch <- struct{}{}:
			default: // one is pending already
			}
		}
	}
}

// watchers is how many Watch streams are open.
func (h *nudgeHub) watchers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, s := range h.subs {
		n += len(s)
	}
	return n
}

// Watch streams nudges to one region's leader while this replica leads
// (see docs/architecture.md, "Nudges"). It refuses an unknown region
// (InvalidArgument) and answers "not leader" like Sync, also later: once
// this replica stops leading, checked at every nudge and every epoch, the
// stream ends with the redirect so the region follows the new leader.
func (s *Service) Watch(req *sluicev1.WatchRequest, stream grpc.ServerStreamingServer[sluicev1.Nudge]) error {
	region := req.GetRegion()
	cfg := s.currentConfig()
	if _, ok := cfg.Regions[region]; !ok {
		return status.Errorf(codes.InvalidArgument, "allocator: watch: region %q is not configured", region)
	}
	if ok, addr := s.leaderAt(time.Now()); !ok {
		return notLeaderError(addr)
	}
	ch, cancel := s.hub.subscribe(region)
	defer cancel()
	check := time.NewTicker(time.Duration(cfg.Epoch))
	defer check.Stop()
	ctx := stream.Context()
	for {
		select {
		case <-ctx.Done():
			// The caller's deadline or cancel ended the stream: say so
			// (a nil would end it as if it had completed, an EOF at the
			// caller whenever the server sees the deadline first).
			return status.FromContextError(ctx.Err()).Err()
		case <-check.C:
			if ok, addr := s.leaderAt(time.Now()); !ok {
				return notLeaderError(addr)
			}
		case <-ch:
			if ok, addr := s.leaderAt(time.Now()); !ok {
				return notLeaderError(addr)
			}
			s.mu.Lock()
			epoch := s.alloc.Epoch()
			s.mu.Unlock()
			if err := stream.Send(&sluicev1.Nudge{Epoch: epoch}); err != nil {
				return err
			}
			s.m.nudgeSent(regionLabel(cfg, region))
		}
	}
}
