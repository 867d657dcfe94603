package allocator

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
)

// run is the allocation loop: every epoch of the live config, while this
// replica leads, it runs one allocation; config changes are applied as
// soon as the source publishes them (or at the next tick when it cannot).
// It returns when ctx is done. It does no network I/O, so it runs inside a
// testing/synctest bubble.
func (s *Service) run(ctx context.Context) {
	// The published value is only a wake-up: the config is always read
	// from the source, so a value replaced before it was read loses nothing.
	var updates <-chan *config.Config
	if sub, ok := s.src.(configSubscriber); ok {
		ch, cancel := sub.Subscribe()
		defer cancel()
		updates = ch
	}
	epoch := s.epoch()
	ticker := time.NewTicker(epoch)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-updates:
			s.mu.Lock()
			s.applyConfigLocked(time.Now())
			s.mu.Unlock()
		case <-ticker.C:
			s.step(time.Now())
		}
		if e := s.epoch(); e != epoch {
			epoch = e
			ticker.Reset(epoch)
		}
	}
}

func (s *Service) epoch() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.timing.epoch
}

// step is one epoch at now: config first, then, if leading, one
// allocation and forgetting idle keys.
func (s *Service) step(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applyConfigLocked(now)
	if ok, _ := s.leaderAt(now); !ok {
		s.pages.clear()
		return
	}
	s.pages.dropStale(now, s.timing.validity)
	s.ensureLearningLocked(now)
	start := time.Now()
	s.alloc.Allocate(now)
	s.m.allocated(time.Since(start))
	s.forgetIdleKeysLocked(now)
}
