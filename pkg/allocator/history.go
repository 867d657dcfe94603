package allocator

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// Reading back the configs of revisions regions report and this replica
// never held (docs/architecture.md, "Static shares that change: make
// before break"). While several configs are in play the allocator reserves
// for each region the smallest share under the revisions it reported from
// the confirmed one on, taking only the revisions whose config it holds
// (Confirmations.Reserve); a region none of whose revisions are held is
// reserved the largest share under any held config, which can be smaller
// than its share under the revision it runs. So a report naming a
// revision the replica does not hold queues a read of that revision's
// config from etcd (configstore.Store.At: validated as every config the
// replica applies), and the config read is held from then on like one the
// replica ran.
//
// The read never runs under s.mu: one goroutine (runHistory) reads the
// queued revisions one at a time, each bounded by historyRequestTimeout a
// request and historyReadTimeout in all, and takes s.mu only to install
// what it read. The report that queued it is answered at once under the
// configs held: until the read lands, the rule above applies (for the
// reporting region the smallest share under its held revisions, or, when
// none is held, the largest share under any held config), and the same
// when the read fails. A revision read, or failed, is not read again
// before historyRetryAfter, so a flood of reports naming it reads etcd at
// most once per that interval; failures are logged at WARN naming the
// revision and counted (sluice_global_config_history_failed_total).

const (
	// historyRequestTimeout bounds one etcd request of a read.
	historyRequestTimeout = 5 * time.Second
	// historyReadTimeout bounds one revision's read in all (At may read
	// back through later commits when etcd compacted the revision).
	historyReadTimeout = 10 * time.Second
	// historyRetryAfter is how long a revision read (or failed) is not
	// read again.
	historyRetryAfter = 30 * time.Second
	// historyQueue bounds the revisions waiting to be read; a report
	// finding the queue full queues nothing, a later one will.
	historyQueue = regionsync.MaxConfigs
)

// configHistory reads the config a revision committed (configstore.Store
// implements it).
type configHistory interface {
	At(ctx context.Context, rev int64) (*config.Config, error)
}

// historyState is the reads of held configs' history. Guarded by s.mu
// except src and wake, set before the Service serves.
type historyState struct {
	src  configHistory // nil: no reads (no etcd)
	wake chan struct{} // capacity 1: something was queued

	queue   []int64             // revisions waiting for a read, oldest first
	pending map[int64]bool      // queued or being read
	tried   map[int64]time.Time // revision -> when its last read ended
}

// queueUnheldLocked queues a read of every revision in revs (those a
// region's report names that the replica does not hold and that would
// bound its reserve: Confirmations.Unheld) not queued already nor read
// within historyRetryAfter. s.mu is held.
func (s *Service) queueUnheldLocked(now time.Time, revs []int64) {
	h := &s.hist
	if h.src == nil || len(revs) == 0 {
		return
	}
	for _, rev := range revs {
		if h.pending[rev] {
			continue
		}
		if at, ok := h.tried[rev]; ok && now.Sub(at) < historyRetryAfter {
			continue
		}
		if len(h.queue) >= historyQueue {
			break
		}
		if h.pending == nil {
			h.pending = map[int64]bool{}
		}
		h.queue = append(h.queue, rev)
		h.pending[rev] = true
	}
	if len(h.queue) > 0 {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
}

// runHistory reads the queued revisions until ctx ends. The daemon runs
// it when it has etcd.
func (s *Service) runHistory(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.hist.wake:
		}
		for {
			s.mu.Lock()
			if len(s.hist.queue) == 0 {
				s.mu.Unlock()
				break
			}
			rev := s.hist.queue[0]
			s.hist.queue = s.hist.queue[1:]
			s.mu.Unlock()
			rctx, cancel := context.WithTimeout(ctx, historyReadTimeout)
			cfg, err := s.hist.src.At(rctx, rev)
			cancel()
			if ctx.Err() != nil {
				return
			}
			s.installHistory(time.Now(), rev, cfg, err)
		}
	}
}

// installHistory holds cfg as the config of rev and brings every key's
// reserve in line, or logs and counts err.
func (s *Service) installHistory(now time.Time, rev int64, cfg *config.Config, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.hist.pending, rev)
	if s.hist.tried == nil {
		s.hist.tried = map[int64]time.Time{}
	}
	for r, at := range s.hist.tried {
		if now.Sub(at) >= historyRetryAfter {
			delete(s.hist.tried, r)
		}
	}
	s.hist.tried[rev] = now
	if err != nil {
		s.m.historyFailed()
		s.log.Warn("could not read the config of a revision a region reports; a region reporting no revision held is reserved the largest share under the configs held",
			"revision", rev, "compacted", errors.Is(err, configstore.ErrHistoryGone), "retry_after", historyRetryAfter, "error", err)
		return
	}
	if _, held := s.held[rev]; held {
		return
	}
	if confirmed, known := s.conf.Confirm(configRegions(s.applied)); known && rev < confirmed {
		return // confirmed past while it was read: it bounds nothing now
	}
	s.held[rev] = cfg
	s.pruneHeldLocked()
	if _, kept := s.held[rev]; !kept {
		return
	}
	s.setLimitsLocked()
	if ok, _ := s.leaderAt(now); ok {
		// A config with another shard count keeps this shard learning.
		s.ensureLearningLocked(now)
	}
	s.log.Info("read the config of a revision a region reports from etcd; reserves count it", "revision", rev)
}
