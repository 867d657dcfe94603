package allocator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
// most once per that interval, and one etcd no longer holds
// (configstore.ErrHistoryGone) is never read again; failures are logged
// at WARN naming the revision and counted
// (sluice_global_config_history_failed_total).
//
// A replica that starts leading also reads back the configs committed just
// before its live one (readRecent), for the regions it has not heard from
// yet: each is reserved the largest share under the configs held, and
// may run any of those.

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
	// historyGoneMax bounds the revisions remembered as gone from etcd's
	// history (the oldest are forgotten first).
	historyGoneMax = 4 * regionsync.MaxChain
)

// configHistory reads the config a revision committed and the revisions
// that committed configs (configstore.Store implements it).
type configHistory interface {
	At(ctx context.Context, rev int64) (*config.Config, error)
	RevisionsBetween(ctx context.Context, from, until int64, max int) ([]int64, error)
}

// historyState is the reads of held configs' history. Guarded by s.mu
// except src and wake, set before the Service serves.
type historyState struct {
	src  configHistory // nil: no reads (no etcd)
	wake chan struct{} // capacity 1: something was queued

	// recent asks for the configs committed just before the live one
	// (readRecent): set when this replica starts leading.
	recent  bool
	queue   []int64             // revisions waiting for a read, oldest first
	pending map[int64]bool      // queued or being read
	tried   map[int64]time.Time // revision -> when its last read ended
	// gone is the revisions whose config etcd no longer holds
	// (configstore.ErrHistoryGone): that does not heal, so they are not
	// read again. At most historyGoneMax.
	gone map[int64]bool
	// priorRead: the timing of the configs committed before this
	// replica's first one was read (learnPriorTiming).
	priorRead bool
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
		if h.pending[rev] || h.gone[rev] {
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
		s.mu.Lock()
		recent, until := s.hist.recent, s.appliedRev
		s.hist.recent = false
		s.mu.Unlock()
		if recent && until > 0 {
			s.readRecent(ctx, until)
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

// askRecentLocked has runHistory read the configs committed just before
// the live one (readRecent). Called when this replica starts leading.
// s.mu is held.
func (s *Service) askRecentLocked() {
	if s.hist.src == nil {
		return
	}
	s.hist.recent = true
	select {
	case s.hist.wake <- struct{}{}:
	default:
	}
}

// readRecent holds the configs of the newest MaxChain-1 revisions that
// committed a config before until (the live revision when this replica
// started leading), read back one commit at a time and stopping at the
// first failure (a compacted revision: configstore.ErrHistoryGone) or at
// historyReadTimeout in all. A region not heard from since may run any
// of them (its chain holds at most MaxChain configs): while it is silent
// its reserve is the largest share under the configs held, these
// included; once every region reported, those no region reports are
// dropped again (pruneHeldLocked). A config of another shard count than
// the live one is left out: held, it would keep this shard learning
// (shard.go's moving) for as long as a region stays silent, and a
// silent region on another shard count is what a reshard's own learning
// and lease owners already cover, as before this read. A failure here is
// not counted: configs compacted long ago are the common case.
func (s *Service) readRecent(ctx context.Context, until int64) {
	rctx, cancel := context.WithTimeout(ctx, historyReadTimeout)
	defer cancel()
	read := 0
	oldest, stopped := s.committedBefore(rctx, until, func(rev int64) error {
		s.mu.Lock()
		_, held := s.held[rev]
		s.mu.Unlock()
		if held {
			return nil
		}
		cfg, err := s.hist.src.At(rctx, rev)
		if err != nil {
			return err
		}
		s.mu.Lock()
		if cfg.ShardMap().N() == s.applied.ShardMap().N() {
			s.holdLocked(time.Now(), rev, cfg)
		}
		s.mu.Unlock()
		read++
		return nil
	})
	if ctx.Err() != nil {
		return // shutting down
	}
	if stopped != nil {
		s.log.Info("read back the configs committed before the live one as far as etcd holds them",
			"read", read, "stopped_at", oldest, "reason", stopped)
		return
	}
	s.log.Info("read back the configs committed before the live one", "read", read, "oldest", oldest)
}

// committedBefore visits the newest MaxChain-1 revisions that committed a
// config before until, newest first, and stops at the first error (from
// etcd, or visit's). It returns the oldest revision reached and that
// error.
func (s *Service) committedBefore(ctx context.Context, until int64, visit func(rev int64) error) (int64, error) {
	for range regionsync.MaxChain - 1 {
		revs, err := s.hist.src.RevisionsBetween(ctx, 0, until, 1)
		if err != nil || len(revs) == 0 {
			return until, err
		}
		until = revs[0]
		if err := visit(until); err != nil {
			return until, err
		}
	}
	return until, nil
}

// learnPriorTiming makes a replica that started after a config change
// that shortened the grant validity learn as one that watched the change
// would have (applyConfigLocked): a leader that ran an older config may
// have issued grants of its longer validity, which regions may still hold
// when this replica leads, silent to it or not. So the configs committed
// before the first one this replica read are read back (the newest
// MaxChain-1, as far as etcd holds them); when one had a longer validity
// than the live config, the allocator is rebuilt to re-issue held grants
// with what they have left up to that validity, and learning lasts at
// least until started plus that validity and its epoch (grants under it
// were issued before the change was committed, so before this replica
// started, or by a leader that saw the change up to an epoch later).
// Once that has passed, nothing is done.
//
// Called once, when this replica first wins the election and before it
// leads. etcd not answering is returned (the caller campaigns again); a
// history compacted away ends the read where it is
// (configstore.ErrHistoryGone: changes that old are past mattering
// unless etcd compacts within one grant validity; docs/operations.md),
// and so does a config this build refuses, logged at WARN.
func (s *Service) learnPriorTiming(ctx context.Context) error {
	s.mu.Lock()
	done, first := s.hist.priorRead, s.firstRev
	s.mu.Unlock()
	if done || s.hist.src == nil || first <= 0 {
		return nil
	}
	var validity, epoch time.Duration
	_, err := s.committedBefore(ctx, first, func(rev int64) error {
		cfg, err := s.hist.src.At(ctx, rev)
		if err != nil {
			return err
		}
		validity = max(validity, time.Duration(cfg.GrantValidity))
		epoch = max(epoch, time.Duration(cfg.Epoch))
		return nil
	})
	switch {
	case err == nil || errors.Is(err, configstore.ErrHistoryGone):
	case unreachable(ctx, err):
		return err
	default:
		// A config etcd holds that this build does not accept (one
		// written by an older version, say) ends the walk as a
		// compaction does: it must not keep the replica from leading.
		s.log.Warn("could not read back a config committed before this replica's first; its grant validity is not known",
			"error", err, "grant_validity_read", validity)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hist.priorRead = true
	now := time.Now()
	floor := s.started.Add(validity + epoch)
	if validity <= s.timing.validity || !now.Before(floor) {
		return nil
	}
	a, err := s.rebuiltLocked(now, allocatorOptions(s.applied), validity)
	if err != nil {
		return fmt.Errorf("rebuild the allocator for the longer validity committed before the live config: %w", err)
	}
	s.replaceAllocatorLocked(a)
	s.learnFloor = later(s.learnFloor, floor)
	s.oldGrantsEnd = later(s.oldGrantsEnd, floor)
	s.log.Info("a config committed before this replica started had a longer grant validity; learning until its grants can have ended",
		"grant_validity", validity, "live_grant_validity", s.timing.validity, "learning_until_at_least", s.learnFloor)
	return nil
}

// unreachable reports whether err says etcd did not answer (ctx's end,
// or the client's deadline or unavailability): worth another attempt,
// unlike an answer that says no.
func unreachable(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
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
		if errors.Is(err, configstore.ErrHistoryGone) {
			s.goneLocked(rev)
		}
		s.m.historyFailed()
		s.log.Warn("could not read the config of a revision a region reports; a region reporting no revision held is reserved the largest share under the configs held",
			"revision", rev, "compacted", errors.Is(err, configstore.ErrHistoryGone), "retry_after", historyRetryAfter, "error", err)
		return
	}
	if s.holdLocked(now, rev, cfg) {
		s.log.Info("read the config of a revision a region reports from etcd; reserves count it", "revision", rev)
	}
}

// goneLocked remembers that etcd no longer holds rev's config: a
// compacted revision stays compacted, and the commits after it only move
// further from it, so a region that keeps reporting it (cut off from etcd
// on it) costs no read, warning or count past the first. s.mu is held.
func (s *Service) goneLocked(rev int64) {
	h := &s.hist
	if h.gone == nil {
		h.gone = map[int64]bool{}
	}
	if len(h.gone) >= historyGoneMax {
		delete(h.gone, slices.Min(slices.Collect(maps.Keys(h.gone))))
	}
	h.gone[rev] = true
}

// holdLocked holds cfg, read back from etcd, as the config of rev unless
// it is held already or bounds nothing (older than the assumed
// revision, or pruned at once), and brings every key's reserve in line.
// It reports whether cfg is held now. s.mu is held.
func (s *Service) holdLocked(now time.Time, rev int64, cfg *config.Config) bool {
	if _, held := s.held[rev]; held {
		return false
	}
	if assumed, known := s.conf.Assumed(); known && rev < assumed {
		return false // assumed past while it was read: it bounds nothing now
	}
	s.held[rev] = cfg
	s.pruneHeldLocked()
	if _, kept := s.held[rev]; !kept {
		return false
	}
	s.setLimitsLocked()
	if ok, _ := s.leaderAt(now); ok {
		// A config with another shard count keeps this shard learning.
		s.ensureLearningLocked(now)
	}
	return true
}
