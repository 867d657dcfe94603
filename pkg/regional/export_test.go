package regional

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// ConfigForTest exposes the live config to the external tests.
func (s *Server) ConfigForTest() *config.Config { return s.opts.Config.Current() }

// RefreshStaticForTest reads the stored static lease and Redis TIME into
// s's view at once (as its background loop does every quarter epoch).
func RefreshStaticForTest(ctx context.Context, s *Server) error { return s.refreshStatic(ctx) }

// RisenForTest is one of l's reads between epochs: whether a key its last
// report watched has risen enough to report now.
func RisenForTest(ctx context.Context, l *Leader) bool {
	rose, _ := l.moved(ctx)
	return rose
}

// RedisTimeoutForTest is the bound s puts on one batch of script calls.
func RedisTimeoutForTest(s *Server) time.Duration { return s.opts.RedisTimeout }

// EvictionReadingsForTest is how many times d read its Redis's eviction
// settings (at start and once an epoch).
func EvictionReadingsForTest(d *Daemon) int64 { return d.evictions.readings.Load() }

// ProbeSourceForTest is the access probe's Lua source.
const ProbeSourceForTest = probeSource

// ConfirmForTest applies a confirmed revision as s's replicas do when they
// read the one their leader stored: s adopts its live config first.
func ConfirmForTest(s *Server, rev int64) {
	s.staticChain()
	s.confirm(rev)
}

// ResumeRetryMaxEpochsForTest bounds the wait between two late reads of
// a region's history, in epochs.
const ResumeRetryMaxEpochsForTest = resumeRetryMaxEpochs

// GuardLookedForTest reports whether d's restart guard has made its first
// look at Redis (at start, before a call, or at an epoch's check).
func GuardLookedForTest(d *Daemon) bool { return d.Server.opts.Guard.Looked() }

// CandidatesForTest is the candidate read of a report of l sent at sendUS
// (Redis time): an epoch report's when epochReport, a catch-up's
// otherwise.
func CandidatesForTest(ctx context.Context, l *Leader, sendUS int64, epoch time.Duration, epochReport bool) ([]quota.Key, error) {
	kind := regionsync.CatchUp
	if epochReport {
		kind = regionsync.Epoch
	}
	return l.candidates(ctx, sendUS, epoch, kind)
}
