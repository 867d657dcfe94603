package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// ConfigSource hands out the live config; it is called from several
// goroutines, so implementations must be safe for concurrent use, and the
// configs they return are never modified. configstore.Watcher implements it; so
// does StaticConfig. When the source also has Subscribe (as
// configstore.Watcher does) changes are applied as soon as they are published,
// otherwise at the next epoch or Sync; when it has Revision, Status reports
// it.
type ConfigSource interface {
	Current() *config.Config
}

// configSubscriber is the optional push side of a ConfigSource.
type configSubscriber interface {
	Subscribe() (<-chan *config.Config, func())
}

// configRevision is the optional etcd revision of a ConfigSource.
type configRevision interface {
	Revision() int64
}

// configLive is the optional config and its revision read together (as
// configstore.Watcher has it).
type configLive interface {
	Live() (*config.Config, int64)
}

// StaticConfig is a ConfigSource that never changes. Safe for concurrent
// use as long as C is not modified.
type StaticConfig struct{ C *config.Config }

// Current returns the wrapped config.
func (s StaticConfig) Current() *config.Config { return s.C }

const (
	// DefaultMaxKeysPerPage bounds the keys of one RegionReport message:
	// a whole report, or one page of a report split into pages (a report
	// has no bound on its keys, see SyncPage). An answer's pages hold as
	// many grants at most.
	DefaultMaxKeysPerPage = regionsync.DefaultMaxKeys
	// DefaultMaxKeysPerReport is DefaultMaxKeysPerPage.
	//
	// Deprecated: the bound is per message (page); use DefaultMaxKeysPerPage.
	DefaultMaxKeysPerReport = DefaultMaxKeysPerPage
	// DefaultStatusKeys is how many keys Status lists when asked for 0.
	DefaultStatusKeys = 10
	// MaxStatusKeys is the most keys Status lists.
	MaxStatusKeys = 1000
)

// serviceOptions configure a Service; the Daemon fills them.
type serviceOptions struct {
	config    ConfigSource // required
	advertise string       // this replica's advertised gRPC address
	maxKeys   int          // keys per message (page); default DefaultMaxKeysPerPage
	maxBytes  int          // bytes of pages held per region; default DefaultMaxReportBytes
	logger    *slog.Logger // default slog.Default()
	// sessionTTL is the etcd session TTL behind the leadership; 0 skips
	// the failover check of region_lease (FailoverBound).
	sessionTTL time.Duration
}

// timing is what the hierarchy.Allocator cannot change after it is built.
type timing struct {
	epoch, validity time.Duration
	alpha           float64
	regionLease     time.Duration
}

// leadState is this replica's view of the election.
type leadState struct {
	leading bool
	// term identifies one won election; only its own keepalives extend it.
	term uint64
	// deadline: this replica grants only before it (newest confirmed lease
	// refresh, timed from its send, plus TTL/2).
	deadline time.Time
	// observed is the leader address last read from etcd ("" = none).
	observed string
}

// Service implements sluicev1.AllocatorServiceServer around one
// hierarchy.Allocator. Leadership is granted and withdrawn by the
// package's elector; a Service nobody elected answers every Sync with
// FailedPrecondition. Safe for concurrent use.
type Service struct {
	sluicev1.UnimplementedAllocatorServiceServer

	src            ConfigSource
	advertise      string
	maxKeys        int // keys per message (page)
	maxReportBytes int // bytes of pages held per region
	log            *slog.Logger
	m              *metrics // set once by the daemon before serving; nil means none
	// sessionTTL is the election's session TTL (0: unknown, not checked);
	// leaseBelowFailover says the applied config's region_lease is shorter
	// than FailoverBound under it (failover.go).
	sessionTTL         time.Duration
	leaseBelowFailover atomic.Bool

	// mu serializes everything that touches the allocator, so a Sync's
	// SetLimit calls and its Report are one step, and the allocator can
	// be swapped when the config changes its timing.
	mu         sync.Mutex
	alloc      *hierarchy.Allocator // guarded by mu
	applied    *config.Config       // guarded by mu: the config alloc was last brought in line with
	appliedRev int64                // guarded by mu: applied's revision
	timing     timing               // guarded by mu: alloc's epoch, validity, alpha and region lease
	learnFloor time.Time            // guarded by mu: learning lasts at least until then
	// oldGrantsEnd: grants an earlier allocator issued with a longer
	// validity (before a config shortened it, or committed before this
	// replica started) have ended by then. Guarded by mu. A confirmation
	// of a config revision waits for it (advanceLocked).
	oldGrantsEnd time.Time
	lastReport   map[string]time.Time // guarded by mu: region -> its last accepted report
	// conf tracks the config revisions regions report and the revision
	// confirmed to them (regionsync's make-before-break of static shares);
	// held are the configs of revisions still in play, by revision, the
	// live one included. Both guarded by mu.
	conf *regionsync.Confirmations
	held map[int64]*config.Config
	// started is when this replica read its first config, firstRev that
	// config's revision (0 without a store): grants issued under the
	// configs committed before it ended by started plus their validity
	// (history.go, learnPriorTiming). Set once, before the Service serves.
	started  time.Time
	firstRev int64
	// stored is the durable lapsed set as this replica last read or wrote
	// it (see lapsed.go); storedMoot says it protects no grant any more (a
	// shard that owned nothing for longer than any grant lasts started
	// owning keys, shard.go), so it is only rewritten, never handed to an
	// allocator. Both guarded by mu.
	stored     []string
	storedMoot bool

	lmu  sync.Mutex // guards lead; taken after mu when both are held
	lead leadState  // guarded by lmu

	// hub delivers nudges to the regions' Watch streams (watch.go).
	hub nudgeHub

	// sh is this replica's shard and the shard map's changes (shard.go).
	// Guarded by mu.
	sh shardState

	// pages holds the paged reports in progress and their answers
	// (pages.go). Guarded by mu.
	pages pageBook

	// hist reads back from etcd the configs of revisions regions report
	// and this replica never held (history.go). Guarded by mu but for
	// its source and wake-up channel.
	hist historyState
}

func newService(o serviceOptions, now time.Time) (*Service, error) {
	if o.config == nil {
		return nil, errors.New("allocator: a ConfigSource is required")
	}
	cfg := o.config.Current()
	if cfg == nil {
		return nil, errors.New("allocator: the ConfigSource has no config")
	}
	if o.maxKeys == 0 {
		o.maxKeys = DefaultMaxKeysPerPage
	}
	if o.maxKeys < 0 {
		return nil, fmt.Errorf("allocator: max keys per page %d is negative", o.maxKeys)
	}
	if o.maxBytes == 0 {
		o.maxBytes = DefaultMaxReportBytes
	}
	if o.maxBytes < 0 {
		return nil, fmt.Errorf("allocator: max report bytes %d is negative", o.maxBytes)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	opts := allocatorOptions(cfg)
	a, err := hierarchy.NewAllocator(opts, now)
	if err != nil {
		return nil, fmt.Errorf("allocator: %w", err)
	}
	s := &Service{
		sessionTTL:     o.sessionTTL,
		src:            o.config,
		advertise:      o.advertise,
		maxKeys:        o.maxKeys,
		maxReportBytes: o.maxBytes,
		log:            o.logger,
		alloc:          a,
		applied:        cfg,
		appliedRev:     revisionOf(o.config, cfg),
		started:        now,
		firstRev:       revisionOf(o.config, cfg),
		timing:         timing{epoch: opts.Epoch, validity: opts.Validity, alpha: opts.DemandAlpha, regionLease: opts.RegionLease},
		lastReport:     make(map[string]time.Time),
		held:           map[int64]*config.Config{revisionOf(o.config, cfg): cfg},
	}
	s.conf = regionsync.NewConfirmations(s.holdsLocked)
	s.checkFailoverLocked(cfg)
	return s, nil
}

// allocatorOptions maps the config to the allocator's options, regions in
// name order so the allocator's outputs do not depend on map order.
func allocatorOptions(cfg *config.Config) hierarchy.Options {
	names := make([]string, 0, len(cfg.Regions))
	for name := range cfg.Regions {
		names = append(names, name)
	}
	slices.Sort(names)
	regions := make([]hierarchy.Region, len(names))
	for i, name := range names {
		r := cfg.Regions[name]
		regions[i] = hierarchy.Region{Name: name, Weight: r.Weight, MinShare: r.MinShare, MaxShare: r.MaxShare, Drained: r.Drained}
	}
	return hierarchy.Options{
		Regions:     regions,
		Epoch:       time.Duration(cfg.Epoch),
		Validity:    time.Duration(cfg.GrantValidity),
		DemandAlpha: cfg.DemandAlpha,
		RegionLease: time.Duration(cfg.RegionLease),
	}
}

// applyConfigLocked brings the allocator in line with the live config:
// regions by SetRegions, limits of known keys by SetLimit, and a new
// allocator when the epoch or the validity changed. s.mu is held.
func (s *Service) applyConfigLocked(now time.Time) {
	cfg := s.src.Current()
	rev := int64(0)
	if l, ok := s.src.(configLive); ok {
		cfg, rev = l.Live()
	} else if r, ok := s.src.(configRevision); ok {
		rev = r.Revision()
	}
	if cfg == nil || cfg == s.applied {
		return
	}
	old := s.applied
	if rev > 0 && rev < s.appliedRev {
		s.rewoundLocked(rev)
	}
	s.applied = cfg
	s.appliedRev = rev
	s.held[rev] = cfg
	s.pruneHeldLocked()
	s.checkFailoverLocked(cfg)
	opts := allocatorOptions(cfg)
	for name := range old.Regions {
		if _, kept := cfg.Regions[name]; !kept {
			delete(s.lastReport, name)
			s.conf.Forget(name)
			s.m.forgetRegion(name)
			s.log.Warn("region removed from the config; its grants are forgotten", "region", name)
		}
	}
	if t := (timing{opts.Epoch, opts.Validity, opts.DemandAlpha, opts.RegionLease}); t != s.timing {
		a, err := s.rebuiltLocked(now, opts, s.timing.validity)
		if err != nil {
			s.log.Error("config change refused by the allocator; keeping the previous timing and regions", "error", err)
			return
		}
		// Grants issued under the old validity may outlive the new
		// allocator's own learning period; one old epoch more covers a
		// previous leader that saw the change later than this replica.
		s.learnFloor = later(s.learnFloor, now.Add(s.timing.validity+s.timing.epoch))
		s.oldGrantsEnd = later(s.oldGrantsEnd, now.Add(s.timing.validity+s.timing.epoch))
		// The new allocator learns for one new validity too: a raised
		// validity keeps regions at their static shares that long, since
		// a previous leader that applied the change first may have issued
		// grants of the new validity that this one cannot see. The log
		// names when learning ends, the later of the two.
		s.log.Info("epoch, grant validity, demand alpha or region lease changed; allocator rebuilt in learning mode",
			"epoch", opts.Epoch, "grant_validity", opts.Validity,
			"learning_until_at_least", later(s.learnFloor, now.Add(opts.Validity.Truncate(time.Millisecond))))
		// The keys carried over get their limits under cfg there.
		s.replaceAllocatorLocked(a)
		s.timing = t
		return
	}
	if !sameRegions(old, cfg) {
		if err := s.alloc.SetRegions(opts.Regions); err != nil {
			s.log.Error("region change refused by the allocator; keeping the previous regions", "error", err)
		} else {
			s.log.Info("regions changed", "regions", len(opts.Regions))
		}
	}
	s.setLimitsLocked()
}

// rewoundLocked forgets what this replica knew of config revisions once
// the live config's revision goes back to rev: etcd was restored from an
// older backup, or rebuilt empty and the config applied again (the config
// watcher follows it: configstore's "etcd revision went backwards"), and the revisions of its former history name
// nothing, or other configs, in the restored one. The replica is then as
// one started on the restored etcd: confirmations start over, or no
// revision below the one confirmed before would ever be confirmed (regions
// would keep the smallest share under the old and every later config);
// the configs held under the former numbers and the reads of them are
// dropped (a region still reporting such a revision is reserved as for
// one never held, and its config is read from the restored etcd); the
// configs committed before rev are read back. s.mu is held, and
// s.appliedRev is still the former revision.
func (s *Service) rewoundLocked(rev int64) {
	s.log.Warn("config revision went back: etcd was restored from an older backup, or rebuilt; the confirmation of config revisions starts over on its history",
		"revision", rev, "former_revision", s.appliedRev)
	s.conf = regionsync.NewConfirmations(s.holdsLocked)
	clear(s.held)
	s.hist.queue = nil
	clear(s.hist.pending)
	clear(s.hist.tried)
	clear(s.hist.gone)
	if s.sh.init && s.sh.mapSince > rev {
		s.sh.mapSince = rev
	}
	s.askRecentLocked()
}

// rebuiltLocked is a new allocator on opts, created at now, for grants
// regions may hold from an allocator of validity prior (or of one older
// still, which the learning floor outlasts): regions the current
// allocator counted (or may have) at their floor get no static lease
// while it learns, and it re-issues held grants above the static shares
// with what they have left, not cut to a shorter new validity. s.mu is
// held.
func (s *Service) rebuiltLocked(now time.Time, opts hierarchy.Options, prior time.Duration) (*hierarchy.Allocator, error) {
	opts.Lapsed = s.lapsedSetLocked()
	opts.PriorValidity = max(prior, s.learnFloor.Sub(now))
	return hierarchy.NewAllocator(opts, now)
}

// replaceAllocatorLocked makes a the allocator, with the keys the one it
// replaces held and their limits under the live config (setLimitsLocked):
// a rebuilt allocator tracks them from now on, so it forgets them no
// sooner than the old one would have. s.mu is held.
func (s *Service) replaceAllocatorLocked(a *hierarchy.Allocator) {
	keys := s.alloc.Keys()
	s.alloc = a
	s.setKeyLimitsLocked(keys)
}

// setLimitsLocked sets the limit of every key the allocator holds under
// the live config, with the static shares regions may run on while they
// run different revisions. s.mu is held.
func (s *Service) setLimitsLocked() {
	s.setKeyLimitsLocked(s.alloc.Keys())
}

// setKeyLimitsLocked is setLimitsLocked for keys. s.mu is held.
func (s *Service) setKeyLimitsLocked(keys []quota.Key) {
	for _, k := range keys {
		res, err := s.applied.Resolve(k)
		if err != nil {
			// The key's class is gone: the old limit stays until the key
			// is forgotten, since regions may still hold grants for it. A
			// rebuilt allocator, which knows no grant for it, does not
			// take the key over.
			continue
		}
		l := s.limitLocked(k, regionsync.KeyLimit(res))
		if err := s.alloc.SetLimit(k, l); err != nil {
			s.log.Error("limit from the new config refused by the allocator; keeping the old one", "key", k, "error", err)
		}
	}
}

// advanceLocked moves the two-step confirmation of config revisions on
// at now (regionsync.Confirmations.Advance): a revision every region
// reported is assumed at once and confirmed once every grant sized before
// has ended, one validity and epoch later and not before the grants of an
// earlier allocator with a longer validity end (oldGrantsEnd). It
// reports whether the assumed or the confirmed revision moved. s.mu is
// held.
func (s *Service) advanceLocked(now time.Time) bool {
	wait := s.timing.validity + s.timing.epoch
	assumedMoved, confirmedMoved := s.conf.Step(now, configRegions(s.applied), wait, s.oldGrantsEnd)
	confirmed, known := s.conf.Confirmed()
	// A revision assumed and confirmed in one step (every region already
	// runs it as confirmed: a new leader, one config) waits for nothing:
	// only its confirmation is said.
	if rev, _ := s.conf.Assumed(); assumedMoved && !(known && rev == confirmed) {
		s.log.Info("every region reported a config revision; counting their shares under it until it is confirmed",
			"revision", rev, "confirm_after", wait)
	}
	if confirmedMoved {
		s.log.Info("config revision confirmed to the regions", "revision", confirmed)
	}
	return assumedMoved || confirmedMoved
}

// holdsLocked says whether this replica holds the config of revision rev
// (the live one, or one read back): only such a revision is confirmed to
// the regions (regionsync.NewConfirmations). s.mu is held.
func (s *Service) holdsLocked(rev int64) bool {
	_, ok := s.held[rev]
	return ok
}

// limitLocked is l with the static share the allocator must assume for each
// region while more than one config is in play (regionsync.Confirmations.
// Reserve): a region may still run a share under an older revision it
// reported, or under a config this replica never saw. With one config in
// play, l unchanged. s.mu is held.
func (s *Service) limitLocked(k quota.Key, l hierarchy.KeyLimit) hierarchy.KeyLimit {
	if len(s.held) <= 1 {
		return l
	}
	names := configRegions(s.applied)
	l.StaticRate, l.StaticBurst = make([]float64, len(names)), make([]float64, len(names))
	l.FloorRate, l.FloorBurst = make([]float64, len(names)), make([]float64, len(names))
	for i, name := range names {
		l.StaticRate[i], l.StaticBurst[i] = s.conf.Reserve(s.held, name, k)
		l.FloorRate[i], l.FloorBurst[i] = s.floorReserveLocked(name, k)
	}
	return l
}

// floorReserveLocked is what the global tier must assume region runs k on
// without a static lease while more than one config is in play: the
// region's floor is the smallest under the configs it honours (see
// regionsync's Chain), so, as Confirmations.Reserve does for the static
// share, the smallest floor under its revisions in play
// (Confirmations.InPlay), or, when none of them is held, the largest under
// any held config. s.mu is held.
func (s *Service) floorReserveLocked(region string, k quota.Key) (rate, burst float64) {
	return s.conf.ReserveOf(s.held, region, func(cfg *config.Config) (float64, float64) { return floorUnder(cfg, region, k) })
}

// floorUnder is region's floor for k under cfg (config.FloorOf), 0 when k
// does not resolve there or the region is not in it.
func floorUnder(cfg *config.Config, region string, k quota.Key) (rate, burst float64) {
	res, err := cfg.Resolve(k)
	if err != nil {
		return 0, 0
	}
	r, b, err := cfg.FloorOf(region, res)
	if err != nil {
		return 0, 0
	}
	return r, b
}

// lapsedSetLocked is the durable lapsed set a new allocator must be given:
// what the store holds and what the current allocator keeps. s.mu is held.
func (s *Service) lapsedSetLocked() []string {
	var set []string
	if !s.storedMoot {
		set = slices.Clone(s.stored)
	}
	for _, r := range s.alloc.LapsedSet() {
		if !slices.Contains(set, r) {
			set = append(set, r)
		}
	}
	slices.Sort(set)
	return set
}

// maxHeldConfigs bounds the configs kept for regions still running them.
// A region reporting only revisions past this bound is reserved the
// largest share under any kept config.
const maxHeldConfigs = 2 * regionsync.MaxConfigs

// pruneHeldLocked keeps the live config and those of revisions some region
// still reports from the assumed one on (Reserve takes no older one), at most maxHeldConfigs (the
// newest). Over that bound, those held only because a region not heard
// from may run them (the configs read back at election, history.go) go
// first: a revision a region reports bounds that region's reserve, and
// dropping it would leave the region reserved only the largest share
// under the others. s.mu is held.
func (s *Service) pruneHeldLocked() {
	from, known := s.conf.Assumed()
	reported := func(rev int64) bool {
		for name := range s.applied.Regions {
			if revs, _ := s.conf.Reported(name); slices.Contains(revs, rev) {
				return true
			}
		}
		return false
	}
	inPlay := func(rev int64) bool {
		if rev == s.appliedRev {
			return true
		}
		if known && rev < from {
			return false
		}
		if reported(rev) {
			return true
		}
		// Regions not heard from since this replica led may run it.
		for name := range s.applied.Regions {
			if _, heard := s.conf.Reported(name); !heard {
				return true
			}
		}
		return false
	}
	var revs []int64
	for rev := range s.held {
		if !inPlay(rev) {
			delete(s.held, rev)
		} else {
			revs = append(revs, rev)
		}
	}
	slices.Sort(revs)
	for i := 0; len(revs) > maxHeldConfigs && i < len(revs); {
		if rev := revs[i]; rev != s.appliedRev && !reported(rev) {
			delete(s.held, rev)
			revs = slices.Delete(revs, i, i+1)
			continue
		}
		i++
	}
	for len(revs) > maxHeldConfigs {
		if revs[0] != s.appliedRev {
			delete(s.held, revs[0])
		}
		revs = revs[1:]
	}
}

// configRegions is cfg's regions in name order (the allocator's order).
func configRegions(cfg *config.Config) []string {
	names := make([]string, 0, len(cfg.Regions))
	for name := range cfg.Regions {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// revisionOf is src's revision of cfg, 0 when it has none.
func revisionOf(src ConfigSource, cfg *config.Config) int64 {
	if l, ok := src.(configLive); ok {
		if c, rev := l.Live(); c == cfg {
			return rev
		}
	}
	if r, ok := src.(configRevision); ok {
		return r.Revision()
	}
	return 0
}

func sameRegions(a, b *config.Config) bool {
	if len(a.Regions) != len(b.Regions) {
		return false
	}
	for name, r := range a.Regions {
		if o, ok := b.Regions[name]; !ok || o != r {
			return false
		}
	}
	return true
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// ensureLearningLocked keeps the allocator learning until learnFloor,
// which keys moving between shards extend (shard.go). s.mu is held.
//
// Learning that is on is extended to learnFloor, not restarted when it
// ends: a restart would forget what was learnt and last a whole grant
// validity more, so learning would end up to a validity after learnFloor
// instead of at it (docs/architecture.md, failure table: "global tier
// resharded").
func (s *Service) ensureLearningLocked(now time.Time) {
	s.reshardLearningLocked(now)
	if !now.Before(s.learnFloor) {
		return
	}
	if !s.alloc.Learning(now) {
		s.alloc.BecomeLeader(now, s.lapsedSetLocked()...)
	}
	s.alloc.ExtendLearning(now, s.learnFloor)
}

// forgetIdleKeysLocked removes keys no report and no answer named for
// long enough that no region can hold a grant for them any more
// (hierarchy.Allocator.ForgetIdle, by the rule the simulator's global
// tier runs too). s.mu is held.
func (s *Service) forgetIdleKeysLocked(now time.Time) {
	s.alloc.ForgetIdle(now, s.learnFloor)
}

// trackedKeys is how many keys the service tracks (for the keys gauge).
func (s *Service) trackedKeys() int {
	return s.allocator().NumKeys()
}

// promote makes this replica the leader for term until deadline, in
// learning mode, with the durable lapsed set read after winning. It
// refuses (false) when deadline has already passed.
func (s *Service) promote(term uint64, deadline time.Time, lapsed []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if !now.Before(deadline) {
		return false
	}
	s.applyConfigLocked(now)
	s.stored, s.storedMoot = slices.Clone(lapsed), false
	s.alloc.BecomeLeader(now, lapsed...)
	// Learning lasts to the floor from the first instant, not from the
	// first epoch or report: status reads it too.
	s.ensureLearningLocked(now)
	clear(s.lastReport)
	s.pages.clear()
	// What regions reported to an earlier term may predate confirmations
	// another leader issued since.
	s.conf = regionsync.NewConfirmations(s.holdsLocked)
	s.sh.idleSince = time.Time{} // an earlier leader may have granted
	s.sh.outSince = time.Time{}
	s.pruneHeldLocked()
	s.setLimitsLocked()
	// Regions not heard from yet may run configs committed before the
	// live one that this replica never ran (history.go).
	s.askRecentLocked()
	s.m.newTerm()
	s.lmu.Lock()
	s.lead.leading = true
	s.lead.term = term
	s.lead.deadline = deadline
	s.lmu.Unlock()
	return true
}

// extend moves term's deadline forward after a confirmed lease refresh.
func (s *Service) extend(term uint64, deadline time.Time) {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	if s.lead.leading && s.lead.term == term && deadline.After(s.lead.deadline) {
		s.lead.deadline = deadline
	}
}

// demote ends term's leadership.
func (s *Service) demote(term uint64) {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	if s.lead.term == term {
		s.lead.leading = false
	}
}

// observeLeader records the leader address read from etcd.
func (s *Service) observeLeader(addr string) {
	s.lmu.Lock()
	s.lead.observed = addr
	s.lmu.Unlock()
}

// leaderAt says whether this replica may grant at now, and otherwise
// which address leads as far as it knows ("" when unknown).
func (s *Service) leaderAt(now time.Time) (bool, string) {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	if s.lead.leading && now.Before(s.lead.deadline) {
		return true, s.advertise
	}
	if s.lead.observed == s.advertise {
		// Stale: this replica no longer leads whatever etcd last said.
		return false, ""
	}
	return false, s.lead.observed
}

// IsLeader reports whether this replica currently answers Sync as leader.
func (s *Service) IsLeader() bool {
	ok, _ := s.leaderAt(time.Now())
	return ok
}

// View is a snapshot of the allocator at now (for operators and tests).
// A replica that does not lead shows the state it had when it last led.
func (s *Service) View(now time.Time) hierarchy.View {
	return s.allocator().View(now)
}

// allocator is the current allocator (a config change or a new term may
// replace it), read under s.mu; its own methods take its own lock.
func (s *Service) allocator() *hierarchy.Allocator {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.alloc
}

// notLeaderError is the redirect regions follow (see Client).
func notLeaderError(addr string) error {
	return status.Error(codes.FailedPrecondition, "not leader; leader="+addr)
}

// NotLeaderAddr extracts the leader address from a "not leader" error: ok
// is true when err is such an error, addr is "" when the replica did not
// know the leader.
func NotLeaderAddr(err error) (addr string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.FailedPrecondition {
		return "", false
	}
	msg := st.Message()
	i := strings.LastIndex(msg, "leader=")
	if !strings.HasPrefix(msg, "not leader") || i < 0 {
		return "", false
	}
	addr = msg[i+len("leader="):]
	if j := strings.IndexAny(addr, " ;,"); j >= 0 {
		addr = addr[:j]
	}
	return addr, true
}

// Sync ingests one region report and answers with its grants. A report
// split into pages goes to SyncPage (pages.go).
func (s *Service) Sync(ctx context.Context, req *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	if req.GetPages() > 1 || req.GetAnswerPage() > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "allocator: sync: page %d of %d pages (answer_page %d): the pages of a report go to SyncPage",
			req.GetPage(), req.GetPages(), req.GetAnswerPage())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	s.applyConfigLocked(now)
	if err := s.addressedLocked(req); err != nil {
		return nil, err
	}
	return s.syncWholeLocked(now, req)
}

// MaxSeqAhead bounds how far a region report's seq may be ahead of the
// allocator's clock, read as microseconds since the Unix epoch.
//
// A region leader numbers its reports from its Redis clock (at least the
// last seq plus one), and the allocator refuses, as stale, any report
// below the last seq it saw of the region. One report with a seq near
// 2^64, from a caller claiming the region or a Redis clock that jumped
// years ahead and back, thus shut the region out until its clock caught
// up: every later report was refused, and the region lapsed to its floor.
// Only the order of seqs matters, so clocks may disagree by far more than
// anything else in the system tolerates; a day is far beyond any clock a
// deployment runs on, and such a report is refused (InvalidArgument)
// before it is recorded.
const MaxSeqAhead = 24 * time.Hour

// checkSeqAhead refuses a seq more than MaxSeqAhead ahead of now.
func checkSeqAhead(now time.Time, seq uint64) error {
	if limit := uint64(now.Add(MaxSeqAhead).UnixMicro()); seq > limit {
		return fmt.Errorf("seq %d is more than %v ahead of this allocator's clock (%d µs since the Unix epoch): a region numbers its reports from its Redis clock; check that clock",
			seq, MaxSeqAhead, now.UnixMicro())
	}
	return nil
}

// syncWholeLocked answers a report that is one message. s.mu is held and
// the config applied.
func (s *Service) syncWholeLocked(now time.Time, req *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	cfg := s.applied
	label := regionLabel(cfg, req.GetRegion())
	rep, limits, err := regionsync.DecodeReport(cfg, req, s.maxKeys)
	if err == nil {
		err = checkSeqAhead(now, rep.Seq)
	}
	if err == nil {
		err = s.alloc.CheckReportKeys(rep)
	}
	if err != nil {
		s.m.report(label, "invalid")
		return nil, status.Error(codes.InvalidArgument, "allocator: sync: "+err.Error())
	}
	return s.reportLocked(now, label, rep, limits, req.GetConfigRevisions())
}

// reportLocked runs one whole decoded report (one message, or the pages
// of one seq assembled) through the allocator and answers with all its
// grants. s.mu is held and the config applied; rep and limits were
// decoded under s.applied.
func (s *Service) reportLocked(now time.Time, label string, rep hierarchy.Report, limits []hierarchy.KeyLimit, revisions []int64) (*sluicev1.RegionGrants, error) {
	if ok, addr := s.leaderAt(now); !ok {
		s.m.report(label, "not_leader")
		return nil, notLeaderError(addr)
	}
	// A key another shard owns is refused before it touches anything.
	if err := s.ownedLocked(rep); err != nil {
		s.m.report(label, "invalid")
		return nil, err
	}
	// A stale report is refused before it touches anything: the limits,
	// tracked keys and observed config revisions below outlive a refusal.
	if last, ok := s.alloc.LastSeq(rep.Region); ok && rep.Seq < last {
		s.m.report(label, "stale")
		return nil, status.Errorf(codes.Aborted, "allocator: sync: hierarchy: report from %q: %v: seq %d is below the last seen %d",
			rep.Region, hierarchy.ErrStaleReport, rep.Seq, last)
	}
	s.ensureLearningLocked(now)
	observed := s.conf.Observe(rep.Region, revisions)
	if s.advanceLocked(now) || observed {
		nHeld := len(s.held)
		s.pruneHeldLocked()
		if nHeld > 1 || len(s.held) > 1 {
			// Reserves depend on every region's revisions: bring every
			// key's static shares in line.
			s.setLimitsLocked()
		}
		// A region running an older shard map keeps this shard learning.
		if observed {
			s.ensureLearningLocked(now)
		}
	}
	// A revision this replica never held is read from etcd in the
	// background (history.go); this report is answered under the configs
	// held, as Confirmations.Reserve takes them.
	s.queueUnheldLocked(now, s.conf.Unheld(s.held, rep.Region))
	// The limits were decoded under s.applied (regionsync.KeyLimit). A key new
	// to the allocator is tracked from here on, whatever Report says, so
	// it is forgotten again once idle (ForgetIdle).
	for i := range rep.Keys {
		limits[i] = s.limitLocked(rep.Keys[i].Key, limits[i])
	}
	if err := s.alloc.SetReportLimits(rep, limits); err != nil {
		// DecodeReport checked the limits, so this is a bug.
		s.m.report(label, "error")
		return nil, status.Error(codes.Internal, "allocator: sync: "+err.Error())
	}
	ans, err := s.alloc.Report(now, rep)
	grants := ans.Grants
	switch {
	case errors.Is(err, hierarchy.ErrStaleReport):
		s.m.report(label, "stale")
		return nil, status.Error(codes.Aborted, "allocator: sync: "+err.Error())
	case errors.Is(err, quota.ErrInvalid):
		s.m.report(label, "invalid")
		return nil, status.Error(codes.InvalidArgument, "allocator: sync: "+err.Error())
	case err != nil:
		s.m.report(label, "error")
		return nil, status.Error(codes.Internal, "allocator: sync: "+err.Error())
	}
	s.lastReport[rep.Region] = now
	// Nudges go out before the answer: a donor asked to report now may
	// acknowledge before the recipient's catch-up report.
	s.hub.nudge(s.alloc.TakeNudges())
	out := regionsync.EncodeGrants(rep, grants, s.alloc.Learning(now), s.alloc.Epoch(), s.alloc.ReportAgain(rep.Region))
	out.StaticLeaseMs = ans.StaticLease.Milliseconds()
	out.ConfirmedRevision, out.ConfirmedKnown = s.conf.Confirmed()
	var sum float64
	for _, g := range grants {
		sum += g.Rate
	}
	s.m.answered(label, len(grants), sum)
	return out, nil
}

// regionLabel keeps metric labels bounded: unconfigured names are "unknown".
func regionLabel(cfg *config.Config, region string) string {
	if _, ok := cfg.Regions[region]; ok {
		return region
	}
	return "unknown"
}

// Status is the operator view. Every replica answers; one that does not
// lead only says so, names the leader and reports its config revision,
// since its allocator state is not the one regions run on.
func (s *Service) Status(ctx context.Context, req *sluicev1.StatusRequest) (*sluicev1.StatusResponse, error) {
	n := int(req.GetTopKeys())
	if n < 0 || n > MaxStatusKeys {
		return nil, status.Errorf(codes.InvalidArgument, "allocator: status: top_keys %d must be in 0..%d (0 means %d)",
			n, MaxStatusKeys, DefaultStatusKeys)
	}
	if n == 0 {
		n = DefaultStatusKeys
	}
	s.mu.Lock()
	now := time.Now()
	s.applyConfigLocked(now)
	a := s.alloc
	s.mu.Unlock()
	leader, addr := s.leaderAt(now)
	out := &sluicev1.StatusResponse{Leader: leader, LeaderAddr: addr, ConfigRevision: s.configRevision()}
	if !leader {
		return out, nil
	}
	v, contended := a.TopView(now, n)
	out.Learning = v.Learning
	out.Epoch = v.Epoch
	s.mu.Lock()
	cfg := s.applied
	pending := map[string]bool{}
	for _, r := range v.Regions {
		pending[r.Name] = s.drainPendingLocked(r.Name)
	}
	s.mu.Unlock()
	floor := floorFraction(cfg)
	out.ClassFloors = classFloors(cfg)
	for _, r := range v.Regions {
		age, at := int64(-1), int64(0)
		if r.Reported {
			age = r.LastReportAge.Milliseconds()
			// The stored instant, so every call names the same one.
			at = r.LastReport.UnixMilli()
		}
		// A drained region whose reserve is still its share under the
		// revision it runs (it has not reported the drain) is reserved
		// whole until it does or lapses.
		reserved := 1.0
		if r.Lapsed || (r.Floored && !pending[r.Name]) {
			reserved = floor
		}
		out.Regions = append(out.Regions, &sluicev1.RegionStatus{
			Region: r.Name, LastReportAgeMs: age, Silent: r.Silent, LastSeq: r.LastSeq,
			State: string(r.State), StaticLeaseMs: r.StaticLease.Milliseconds(), ReservedFraction: reserved,
			LastReportUnixMs: at, DrainPending: pending[r.Name] && !r.Lapsed, Lapsed: r.Lapsed,
		})
	}
	out.Keys, out.ContendedKeys = keyStatuses(v), int64(contended)
	return out, nil
}

// currentConfig is the config the allocator was last brought in line with.
func (s *Service) currentConfig() *config.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

// floorFraction is the fraction of its static share the global tier
// reserves for a lapsed or drained region: the largest partition_share of
// any class (each class's own is what applies to its keys).
func floorFraction(cfg *config.Config) float64 {
	var f float64
	for name := range cfg.Classes {
		f = max(f, cfg.PartitionShareOf(name))
	}
	return f
}

// classFloors is every class's partition_share under cfg, by class name.
func classFloors(cfg *config.Config) []*sluicev1.ClassFloor {
	names := make([]string, 0, len(cfg.Classes))
	for name := range cfg.Classes {
		names = append(names, name)
	}
	slices.Sort(names)
	out := make([]*sluicev1.ClassFloor, len(names))
	for i, name := range names {
		out[i] = &sluicev1.ClassFloor{Class: name, PartitionShare: cfg.PartitionShareOf(name)}
	}
	return out
}

// drainPendingLocked says whether the live config drains region while the
// static share the allocator reserves for it is still one under a config
// that does not: as Confirmations.Reserve takes it (used while more than
// one config is in play), the smallest share under the revisions region
// reported from the assumed one on, or, when none of them is held, the
// largest under any held config. A region absent from a config has no
// share there, as if drained. s.mu is held.
func (s *Service) drainPendingLocked(region string) bool {
	if r, ok := s.applied.Regions[region]; !ok || !r.Drained || len(s.held) <= 1 {
		return false
	}
	drains := func(cfg *config.Config) bool {
		r, ok := cfg.Regions[region]
		return !ok || r.Drained
	}
	found := false
	for rev := range s.conf.InPlay(region) {
		cfg, held := s.held[rev]
		if !held {
			continue
		}
		if drains(cfg) {
			return false
		}
		found = true
	}
	if found {
		return true
	}
	for _, cfg := range s.held {
		if !drains(cfg) {
			return true
		}
	}
	return false
}

func (s *Service) configRevision() int64 {
	if r, ok := s.src.(configRevision); ok {
		return r.Revision()
	}
	return 0
}

// keyStatuses is the status of each key v shows, in its order (the top
// keys of Allocator.TopView).
func keyStatuses(v hierarchy.View) []*sluicev1.KeyStatus {
	out := make([]*sluicev1.KeyStatus, 0, len(v.Keys))
	for i := range v.Keys {
		kv := &v.Keys[i]
		ks := &sluicev1.KeyStatus{
			Key:   &sluicev1.QuotaKey{Tenant: kv.Key.Tenant, Class: kv.Key.Class},
			Rate:  kv.Limit.Rate,
			Burst: kv.Limit.Burst,
		}
		for i, kr := range kv.Regions {
			var valid int64
			if !kr.GrantExpiry.IsZero() {
				valid = max(kr.GrantExpiry.Sub(v.At).Milliseconds(), 0)
			}
			ks.Demand += kr.Demand
			ks.Regions = append(ks.Regions, &sluicev1.KeyRegionStatus{
				Region:       v.Regions[i].Name,
				Demand:       kr.Demand,
				Target:       kr.TargetRate,
				GrantedRate:  kr.GrantedRate,
				GrantedBurst: kr.GrantedBurst,
				ValidMs:      valid,
				StaticRate:   kr.StaticRate,
			})
		}
		out = append(out, ks)
	}
	return out
}
