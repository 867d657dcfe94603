// Package configtest holds a config source for tests whose config and etcd
// revision the test changes while daemons read it, as they read
// configstore.Watcher's.
package configtest

import (
	"sync"

	"github.com/sluicehq/sluice/pkg/config"
)

// Source hands out the config and revision last set (Current, Live and
// Revision, as configstore.Watcher does). The zero value holds no config
// at revision 0. Safe for concurrent use.
type Source struct {
	mu  sync.Mutex
	cfg *config.Config // guarded by mu
	rev int64          // guarded by mu
}

// NewSource returns a Source holding cfg at revision rev.
func NewSource(cfg *config.Config, rev int64) *Source {
	return &Source{cfg: cfg, rev: rev}
}

// Current is the config last set.
func (s *Source) Current() *config.Config { c, _ := s.Live(); return c }

// Revision is the revision last set.
func (s *Source) Revision() int64 { _, rev := s.Live(); return rev }

// Live is the config last set and its revision, read together.
func (s *Source) Live() (*config.Config, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg, s.rev
}

// Set makes cfg at revision rev the live config.
func (s *Source) Set(cfg *config.Config, rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg, s.rev = cfg, rev
}

// Next makes cfg the live config at the next revision.
func (s *Source) Next(cfg *config.Config) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg = cfg
	s.rev++
}
