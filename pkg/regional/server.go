package regional

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/logthrottle"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/luascripts"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional/reply"
	"github.com/sluicehq/sluice/pkg/regional/rpcerr"
	"github.com/sluicehq/sluice/pkg/regionsync"
	"github.com/sluicehq/sluice/pkg/shard"
)

// ConfigSource hands out the live config. configstore.Watcher implements it;
// StaticConfig wraps a fixed one.
type ConfigSource interface {
	Current() *config.Config
}

// StaticConfig is a ConfigSource that never changes.
type StaticConfig struct{ C *config.Config }

// Current returns the wrapped config.
func (s StaticConfig) Current() *config.Config { return s.C }

// Redis is what the server needs of a go-redis client (a *redis.Client or
// a *redis.ClusterClient).
type Redis interface {
	redis.Cmdable
	redis.Scripter
}

// Options configure a Server.
type Options struct {
	// Region is this region's name; it must be a region of the config.
	// Required.
	Region string
	// Redis is the region's Redis. Required.
	Redis Redis
	// Config is the live config. Required.
	Config ConfigSource
	// Guard dates Redis data sets (see RestartGuard): with one, a bucket
	// created after a data loss starts empty for the restart wait; the
	// server checks it every interval of Run. Optional: without one, new
	// buckets always start full (tests, development).
	Guard *RestartGuard
	// Prefix starts every Redis key. Optional, default luascripts.DefaultPrefix.
	Prefix string
	// ReapBudget is how many expired leases one script call reaps.
	// Optional, default 8.
	ReapBudget int
	// MaxKeysPerSync bounds the reports in one Sync or Release. Optional,
	// default MaxReportsPerCall.
	MaxKeysPerSync int
	// RedisTimeout bounds one pipelined batch of script calls. Optional,
	// default 1s.
	RedisTimeout time.Duration
	// Logger. Optional, default slog.Default().
	Logger *slog.Logger
	// Registerer receives the server's metrics. Optional (no metrics).
	Registerer prometheus.Registerer
	// Unleased makes the static shares unconditional, as they were before
	// static leases: the region never drops to its floor. Only for a
	// region with no global tier at all (tests of the regional tier alone,
	// a single-region process). With a global tier it is unsafe: the
	// global tier re-divides a region's share once its static lease
	// lapsed, and an unleased region would keep running on it. Default
	// false: the region runs on its static shares only while the static
	// lease its leader stores in Redis is known valid, else on its floor
	// (each class's partition_share of the static share); a region whose
	// Redis holds no lease (a fresh or emptied Redis) starts on its floor.
	// cmd/regional and internal/devcluster set it only when asked to run
	// with no global tier. Its answers say so (Grant.unleased,
	// CheckResponse.unleased): a cost above the region's cap then waits in
	// vain, and instances answer it "never" (docs/architecture.md, "No
	// edge promises a wait that cannot be honoured").
	Unleased bool
	// OnChain, when set, is called with the replica's chain of configs
	// (regionsync.Chain: the static shares it honours) each time the
	// replica stores a new one (a config adopted, a report marked, a
	// confirmation applied, the region's history read, and once at New),
	// under the lock that orders those stores and before any call is
	// served under it. It lets the simulator's oracle see the static
	// shares a real replica runs on as they change. It must return quickly
	// and not call the Server. Optional.
	OnChain func(regionsync.Chain)
}

// Server implements sluicev1.LeaseServiceServer. Safe for concurrent use.
type Server struct {
	sluicev1.UnimplementedLeaseServiceServer

	opts    Options
	scripts *luascripts.Scripts
	guard   *RestartGuard
	// chain is the configs whose static shares the replica honours
	// (regionsync.Chain); chainMu serializes its updates.
	chain   atomic.Pointer[regionsync.Chain]
	chainMu sync.Mutex
	// unconfirmedRev is the revision this process started on and counts
	// as confirmed without having read its region's history (ResumeChain
	// failed), until a later read or a confirmation ends that; 0 for
	// none. Cleared under chainMu.
	unconfirmedRev atomic.Int64
	// configRises are the recent confirmations that may have raised
	// static shares, each with the chain before it (regionsync.
	// ConfigRises); nil for none. Written under chainMu.
	configRises atomic.Pointer[regionsync.ConfigRises]
	// static is the replica's view of the static lease (static.go);
	// staticMu serializes its updates.
	static   atomic.Pointer[staticView]
	staticMu sync.Mutex
	// maps is the global tier's shard maps the replica's keys are leased
	// under (shards.go); mapsMu serializes its updates and guards retired
	// (dropped maps and until when they still count) and lastMaps (the
	// chain's maps last seen).
	maps     atomic.Pointer[mapsView]
	mapsMu   sync.Mutex
	retired  map[int]time.Time
	lastMaps []shard.Map
	active   *activeKeys
	batch    *batcher
	// nodes routes the calls of a region on a Redis Cluster by their key's
	// master (nil on a single Redis, whose calls all go through batch).
	nodes   *clusterNodes
	metrics *metrics
	log     *slog.Logger
	// scriptLog spaces the lines about failing script calls.
	scriptLog *logthrottle.Throttle
	// sentinelFailing is whether the last restart sentinel check failed,
	// so a Redis outage is logged once, not every epoch. Owned by Run's
	// goroutine.
	sentinelFailing bool
	// looking is closed when the first look in flight (lookFirst) ends;
	// nil when none is. Guarded by lookMu.
	lookMu  sync.Mutex
	looking chan struct{}
}

// scriptFailureLogEvery is the least time between two log lines about
// failing calls of one script. A Redis outage fails every caller's call:
// each is counted (sluice_regional_redis_errors_total) but one line a
// second per script says it as well as thousands.
const scriptFailureLogEvery = time.Second

// New validates opts and returns a Server.
func New(opts Options) (*Server, error) {
	if opts.Redis == nil {
		return nil, errors.New("regional: Options.Redis is required")
	}
	if opts.Config == nil || opts.Config.Current() == nil {
		return nil, errors.New("regional: Options.Config is required")
	}
	if err := quota.ValidateID("region", opts.Region); err != nil {
		return nil, fmt.Errorf("regional: %w", err)
	}
	if _, ok := opts.Config.Current().Regions[opts.Region]; !ok {
		return nil, fmt.Errorf("regional: region %q is not in the config", opts.Region)
	}
	if opts.Prefix == "" {
		opts.Prefix = luascripts.DefaultPrefix
	}
	if opts.ReapBudget == 0 {
		opts.ReapBudget = 8
	}
	if opts.ReapBudget < 0 {
		return nil, fmt.Errorf("regional: ReapBudget %d must not be negative", opts.ReapBudget)
	}
	if opts.MaxKeysPerSync == 0 {
		opts.MaxKeysPerSync = MaxReportsPerCall
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RedisTimeout == 0 {
		opts.RedisTimeout = time.Second
	}
	scripts := luascripts.New()
	if opts.Guard != nil {
		// The guard counts the re-births the scripts' calls make (a data
		// set gone back in time) and re-births untouched data sets itself:
		// one view of the generations for both.
		scripts = luascripts.NewWith(opts.Guard.Generations())
	}
	s := &Server{
		opts:    opts,
		scripts: scripts,
		guard:   opts.Guard,
		active:  newActiveKeys(),
		log:     opts.Logger,

		scriptLog: logthrottle.New(scriptFailureLogEvery),
	}
	// The config the process starts on counts as confirmed until
	// ResumeChain reads the region's history (see docs/architecture.md,
	// invariant 2).
	cfg, rev := live(opts.Config)
	s.storeChain(regionsync.NewChain(rev, cfg))
	s.static.Store(&staticView{}) // no lease known: the floor until the first reading
	s.metrics = newMetrics(opts.Registerer, s)
	s.batch = newBatcher(opts.Redis, s.scripts, 4, 64, opts.RedisTimeout)
	if cc, ok := opts.Redis.(*redis.ClusterClient); ok {
		s.nodes = newClusterNodes(cc, s.scripts, 4, 64, opts.RedisTimeout)
	}
	return s, nil
}

// Register adds the LeaseService to g.
func (s *Server) Register(g *grpc.Server) { sluicev1.RegisterLeaseServiceServer(g, s) }

// Scripts exposes the script runner (the region leader shares it).
func (s *Server) Scripts() *luascripts.Scripts { return s.scripts }

// keyPlan is everything needed to run a script for one validated key.
type keyPlan struct {
	key    quota.Key
	res    config.Resolved
	keys   luascripts.Keys
	common luascripts.Common
	// readUS is when the region leader's report read the key's state
	// (Redis time; 0 outside a report): its grant is measured from
	// there (regionsync.Install.ReadAt).
	readUS int64
}

// plan validates k against the live config and derives the script inputs.
func (s *Server) plan(cfg *config.Config, pk *sluicev1.QuotaKey, field string) (keyPlan, error) {
	if pk == nil {
		return keyPlan{}, fmt.Errorf("%w: %s is missing", quota.ErrInvalid, field)
	}
	k := quota.Key{Tenant: pk.GetTenant(), Class: pk.GetClass()}
	if err := k.Validate(); err != nil {
		return keyPlan{}, fmt.Errorf("%s: %w", field, err)
	}
	if _, ok := cfg.Regions[s.opts.Region]; !ok {
		// The request is fine; this replica has nothing to decide it with.
		return keyPlan{}, fmt.Errorf("%w: region %q is not in the live config (drain a region before removing it)", errRegionRemoved, s.opts.Region)
	}
	res, err := cfg.Resolve(k)
	if err != nil {
		return keyPlan{}, fmt.Errorf("%s: %w", field, err)
	}
	c, err := s.common(cfg, k, res)
	if err != nil {
		return keyPlan{}, fmt.Errorf("%s: %w", field, err)
	}
	return keyPlan{key: k, res: res, keys: s.keysFor(k), common: c}, nil
}

// keysFor names k's Redis keys; on a cluster its born sentinel is its
// hash slot's.
func (s *Server) keysFor(k quota.Key) luascripts.Keys {
	if _, ok := s.opts.Redis.(*redis.ClusterClient); ok {
		return luascripts.ClusterKeysFor(s.opts.Prefix, k)
	}
	return luascripts.KeysFor(s.opts.Prefix, k)
}

// Common derives the script settings of a resolved key in this region.
func (s *Server) common(cfg *config.Config, k quota.Key, res config.Resolved) (luascripts.Common, error) {
	// The static share is the smallest under every config not yet
	// confirmed past: a raise waits until every region adopted it; and it
	// is the floor once the static lease is not known valid.
	chain := s.staticChain()
	now := time.Now()
	var rate, burst float64
	var deadline int64
	var rise regionsync.Rise
	var err error
	onStatic := true
	fill := luascripts.FillTime(res.Limit.Rate, float64(res.Limit.Burst))
	if s.opts.Unleased {
		// No lease, no floor, no confirmations: no rise.
		rate, burst, err = chain.Share(s.opts.Region, k, cfg, res)
	} else {
		v := s.static.Load()
		// The key's owners under every shard map in play: its lease is the
		// shortest of theirs and its rise the latest (regionsync.KeyLease,
		// KeyRise), worked out from one read of the maps.
		maps := s.shardMaps()
		lease, margin, est := regionsync.KeyLease(k, maps, v.leases), regionsync.StaticMargin(time.Duration(cfg.Epoch)), v.clock.Estimate(now)
		rate, burst, err = chain.Leased(s.opts.Region, k, cfg, res, est, lease, margin)
		onStatic = regionsync.OnStatic(est, lease, margin)
		// A script queued in a paused Redis that runs after the static
		// lease it was handed the share under changes nothing.
		deadline = regionsync.ScriptDeadline(est, lease, margin)
		if err == nil && onStatic {
			// The region came back from its floor (regionsync.
			// ShardRises), or a confirmation raised its share: idle
			// time before is credited at most what it ran then
			// (docs/architecture.md, "Coming back from a floor").
			rise = s.riseOf(k, cfg, res, regionsync.KeyRise(k, maps, v.rises), est, fill, margin, regionsync.Share{Rate: rate, Burst: burst})
		}
	}
	if err != nil {
		return luascripts.Common{}, err
	}
	// A burst of 0 on the static share that only a config not yet knowing
	// the key's class (or this region) makes: the key waits for its share
	// without an empty bucket (docs/architecture.md, "A key first used
	// while its share is awaited").
	awaiting := burst == 0 && onStatic && chain.Awaiting(s.opts.Region, k, cfg, res)
	return luascripts.Common{
		StaticRate:   rate,
		StaticBurst:  burst,
		LeaseTTL:     time.Duration(cfg.LeaseTTL),
		Reclaim:      res.Class.Reclaim != config.ReclaimNone,
		RestartWait:  s.guard.RestartWait(cfg),
		ReapBudget:   s.opts.ReapBudget,
		DemandWindow: cfg.DemandWindow(),
		MarkEvery:    s.markEvery(cfg),
		DeadlineUS:   deadline,
		RiseUS:       rise.RiseUS,
		FloorRate:    rise.Floor.Rate,
		FloorBurst:   rise.Floor.Burst,

		AwaitingShare: awaiting,
		// At a static cap of 0 the keys live until the share, should it
		// come back, would have refilled them (lib.lua, bucket_ttl).
		ShareFill: fill,
	}, nil
}

// riseOf is the rise the scripts are told of for k on its static share:
// floorRise, its shards' rise off a floor (regionsync.KeyRise), and the
// recent confirmations, those that still matter within its fill time
// (regionsync.RiseFor). Nothing to work out, the usual case, costs a load.
func (s *Server) riseOf(k quota.Key, cfg *config.Config, res config.Resolved, floorRise, est int64, fill, margin time.Duration, share regionsync.Share) regionsync.Rise {
	var rises regionsync.ConfigRises
	if p := s.configRises.Load(); p != nil {
		rises = *p
	}
	if floorRise == 0 && len(rises) == 0 {
		return regionsync.Rise{}
	}
	return regionsync.RiseFor(est, fill, margin, floorRise, regionsync.FloorOf(share, res), share, rises, s.opts.Region, k, cfg, res)
}

// markEvery is the scripts' candidate mark interval: a quarter epoch, or
// none for a region with no global tier (Unleased).
func (s *Server) markEvery(cfg *config.Config) time.Duration {
	if s.opts.Unleased {
		return 0
	}
	return regionsync.MarkEvery(time.Duration(cfg.Epoch))
}

// CommonFor is common for a key, for the region leader.
func (s *Server) CommonFor(cfg *config.Config, k quota.Key) (luascripts.Keys, luascripts.Common, config.Resolved, error) {
	p, err := s.plan(cfg, &sluicev1.QuotaKey{Tenant: k.Tenant, Class: k.Class}, "key")
	return p.keys, p.common, p.res, err
}

func validateReport(r *sluicev1.KeyReport, field string) error {
	if r == nil {
		return fmt.Errorf("%w: %s is missing", quota.ErrInvalid, field)
	}
	if r.GetKey() == nil && r.GetSeq() == 0 {
		// An empty message on the wire (the list's entry left blank):
		// "seq must be at least 1" would point at the wrong field.
		return fmt.Errorf("%w: %s is empty: a report names its key and carries a seq of at least 1", quota.ErrInvalid, field)
	}
	if r.GetSeq() == 0 {
		return fmt.Errorf("%w: %s.seq must be at least 1", quota.ErrInvalid, field)
	}
	if r.GetSeq() > 1<<53 {
		return fmt.Errorf("%w: %s.seq %d exceeds 2^53", quota.ErrInvalid, field, r.GetSeq())
	}
	if r.GetLease() > r.GetSeq() {
		return fmt.Errorf("%w: %s.lease %d is above its seq %d", quota.ErrInvalid, field, r.GetLease(), r.GetSeq())
	}
	// used, denied and returned are a lease's cumulative totals: exact in
	// the scripts' doubles up to 2^53.
	for _, f := range []struct {
		name string
		v    int64
		max  int64
	}{{"used", r.GetUsed(), maxTotal}, {"denied", r.GetDenied(), maxTotal}, {"returned", r.GetReturned(), maxTotal},
		{"built_us", r.GetBuiltUs(), maxTotal},
		{"min", r.GetMin(), quota.MaxWant}} {
		if f.v < 0 {
			return fmt.Errorf("%w: %s.%s %d is negative", quota.ErrInvalid, field, f.name, f.v)
		}
		if f.v > f.max {
			return fmt.Errorf("%w: %s.%s %d exceeds the maximum %d", quota.ErrInvalid, field, f.name, f.v, f.max)
		}
	}
	if err := quota.ValidateWant(r.GetWant()); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	if r.GetWant() > 0 && r.GetMin() > r.GetWant() {
		return fmt.Errorf("%w: %s.min %d exceeds want %d", quota.ErrInvalid, field, r.GetMin(), r.GetWant())
	}
	return nil
}

// maxTotal bounds a report's cumulative totals (exact in a Lua number).
const maxTotal = 1 << 53

// errConflict: a report was neither the lease's next one nor a retry of an
// applied one; another process reports under the same instance id. The
// lease was forfeited. Mapped to ABORTED: the instance must re-identify.
// errRegionRemoved: the live config no longer lists the replica's region
// (an operator removed it while it ran). Its requests are answered
// FailedPrecondition, which instances decide with their on_failure policy
// as for any region that cannot decide, not InvalidArgument, which would
// blame the request and make instances forget the key.
var errRegionRemoved = errors.New("region removed from the config")

var errConflict = errors.New("report conflicts with the lease's record: another process reports under this instance id")

// toReport: see reply.Report.
func toReport(instance string, incarnation uint64, r *sluicev1.KeyReport, strict bool) luascripts.Report {
	return reply.Report(instance, incarnation, r, strict)
}

func (s *Server) grant(p keyPlan, seq uint64, lr luascripts.LeaseReply) *sluicev1.Grant {
	return reply.Grant(new(sluicev1.Grant), &sluicev1.QuotaKey{Tenant: p.key.Tenant, Class: p.key.Class}, p.res, seq, lr, s.opts.Unleased)
}

func (s *Server) observeLease(p keyPlan, want int64, lr luascripts.LeaseReply) {
	s.active.touch(time.Now(), p.key, lr.Live)
	if lr.Reclaimed > 0 {
		s.metrics.reclaimed.Add(float64(lr.Reclaimed))
	}
	if lr.Returned > 0 {
		s.metrics.returned.Add(float64(lr.Returned))
	}
	if want <= 0 || lr.Duplicate {
		return
	}
	result := "granted"
	if lr.Granted == 0 {
		result = "empty"
	}
	s.metrics.decisions.WithLabelValues(p.key.Class, p.res.Tier, result).Inc()
	s.metrics.granted.WithLabelValues(p.key.Class, p.res.Tier).Add(float64(lr.Granted))
}

// Acquire implements LeaseService.Acquire.
func (s *Server) Acquire(ctx context.Context, req *sluicev1.AcquireRequest) (resp *sluicev1.AcquireResponse, err error) {
	defer s.observe("Acquire", time.Now(), &err)
	if err := quota.ValidateID("instance_id", req.GetInstanceId()); err != nil {
		return nil, toStatus(err)
	}
	r := req.GetReport()
	if err := validateReport(r, "report"); err != nil {
		return nil, toStatus(err)
	}
	start := time.Now()
	p, err := s.plan(s.opts.Config.Current(), r.GetKey(), "report.key")
	if err != nil {
		return nil, toStatus(err)
	}
	if err := admissibleMin(r, p, "report"); err != nil {
		return nil, toStatus(err)
	}
	rep := toReport(req.GetInstanceId(), req.GetIncarnation(), r, p.res.Class.Mode == config.ModeStrict)
	s.lookFirst(ctx)
	var lr luascripts.LeaseReply
	err = s.call(ctx, p.keys.Bucket, func(ctx context.Context, pipe redis.Pipeliner) *luascripts.Queued {
		return s.scripts.QueueAcquire(ctx, pipe, p.keys, p.common, rep)
	}, func(q *luascripts.Queued) (err error) {
		lr, err = luascripts.ParseLease(q)
		return err
	})
	err = s.observeScript(ctx, "acquire", start, err)
	if err != nil {
		return nil, toStatus(err)
	}
	if lr.Conflict {
		return nil, toStatus(fmt.Errorf("key %s: %w", p.key, errConflict))
	}
	s.observeLease(p, rep.Want, lr)
	return &sluicev1.AcquireResponse{Grant: s.grant(p, r.GetSeq(), lr)}, nil
}

// Sync implements LeaseService.Sync: every key of one instance in about
// one Redis round trip (pipelines of script calls side by side,
// luascripts.RunQueued).
func (s *Server) Sync(ctx context.Context, req *sluicev1.SyncRequest) (resp *sluicev1.SyncResponse, err error) {
	defer s.observe("Sync", time.Now(), &err)
	start := time.Now()
	plans, err := s.planReports(req.GetInstanceId(), req.GetReports())
	if err != nil {
		return nil, toStatus(err)
	}
	for i, p := range plans {
		if err := admissibleMin(req.GetReports()[i], p, fmt.Sprintf("reports[%d]", i)); err != nil {
			return nil, toStatus(err)
		}
	}
	grants := make([]*sluicev1.Grant, len(plans))
	items := make([]luascripts.SyncItem, len(plans))
	for i, p := range plans {
		rep := toReport(req.GetInstanceId(), req.GetIncarnation(), req.GetReports()[i], p.res.Class.Mode == config.ModeStrict)
		items[i] = luascripts.SyncItem{Keys: p.keys, Common: p.common, Report: rep}
	}
	if len(items) > 0 {
		s.lookFirst(ctx)
		results := s.syncMany(ctx, items)
		var err error
		nodeFailures := 0
		for _, r := range results {
			if r.Err != nil && err == nil {
				err = r.Err
			}
			if isNodeFailure(r.Err) {
				nodeFailures++
			}
		}
		err = s.observeScript(ctx, "sync", start, err)
		// A caller that takes per-key failures is answered for the keys
		// whose masters served them when every failure was a master's
		// (clusterNodes); otherwise the Sync fails as a whole.
		perKey := req.GetKeyFailures() && nodeFailures > 0 && ctx.Err() == nil
		if err != nil && !(perKey && nodeFailures == countErrs(results)) {
			// Keys that did succeed are applied; the instance retries the
			// whole Sync with the same seqs and gets their grants again.
			return nil, toStatus(err)
		}
		var conflicts []string
		for i, res := range results {
			if res.Err != nil {
				r := req.GetReports()[i]
				grants[i] = &sluicev1.Grant{Key: r.GetKey(), Seq: r.GetSeq(), RedisFailed: true}
				continue
			}
			if res.Reply.Conflict {
				conflicts = append(conflicts, plans[i].key.String())
				continue
			}
			s.observeLease(plans[i], items[i].Report.Want, res.Reply)
			grants[i] = s.grant(plans[i], items[i].Report.Seq, res.Reply)
		}
		if len(conflicts) > 0 {
			// The other keys are applied; a retry is answered as a retry.
			return nil, toStatus(fmt.Errorf("keys %v: %w", conflicts, errConflict))
		}
	}
	return &sluicev1.SyncResponse{Grants: grants}, nil
}

// admissibleMin refuses a report whose request needs more tokens than the
// key's burst: no wait and no grant can ever admit it, so it is invalid
// input, refused before a script could create a bucket or a lease for it
// (as Check refuses such a cost).
func admissibleMin(r *sluicev1.KeyReport, p keyPlan, field string) error {
	if r.GetMin() > p.res.Limit.Burst {
		return fmt.Errorf("%w: %s.min: cost %d exceeds the burst %d of %s: it could never be admitted",
			quota.ErrInvalid, field, r.GetMin(), p.res.Limit.Burst, p.key)
	}
	return nil
}

// planReports validates an instance id and a batch of reports as a whole:
// one bad report refuses the batch before anything runs.
func (s *Server) planReports(instance string, reports []*sluicev1.KeyReport) ([]keyPlan, error) {
	if err := quota.ValidateID("instance_id", instance); err != nil {
		return nil, err
	}
	if len(reports) > s.opts.MaxKeysPerSync {
		return nil, fmt.Errorf("%w: %d reports exceed the bound reports_per_sync=%d; split the call", quota.ErrInvalid, len(reports), s.opts.MaxKeysPerSync)
	}
	cfg := s.opts.Config.Current()
	plans := make([]keyPlan, len(reports))
	seen := make(map[quota.Key]int, len(reports))
	for i, r := range reports {
		field := fmt.Sprintf("reports[%d]", i)
		if err := validateReport(r, field); err != nil {
			return nil, err
		}
		p, err := s.plan(cfg, r.GetKey(), field+".key")
		if err != nil {
			return nil, err
		}
		if j, dup := seen[p.key]; dup {
			return nil, fmt.Errorf("%w: %s repeats key %s of reports[%d]", quota.ErrInvalid, field, p.key, j)
		}
		seen[p.key] = i
		plans[i] = p
	}
	return plans, nil
}

// Release implements LeaseService.Release.
func (s *Server) Release(ctx context.Context, req *sluicev1.ReleaseRequest) (resp *sluicev1.ReleaseResponse, err error) {
	defer s.observe("Release", time.Now(), &err)
	start := time.Now()
	plans, err := s.planReports(req.GetInstanceId(), req.GetReports())
	if err != nil {
		return nil, toStatus(err)
	}
	// Every key in one pipeline (one round trip per node): an instance
	// releasing many idle keys at once is answered well within its Sync
	// timeout.
	items := make([]luascripts.SyncItem, len(plans))
	for i, p := range plans {
		// Whatever the class's mode now: a lease issued before a change to
		// strict ends exactly.
		items[i] = luascripts.SyncItem{Keys: p.keys, Common: p.common,
			Report: toReport(req.GetInstanceId(), req.GetIncarnation(), req.GetReports()[i], false)}
	}
	var total int64
	var conflicts []string
	if len(items) > 0 {
		s.lookFirst(ctx)
		results := s.releaseMany(ctx, items)
		var err error
		for _, r := range results {
			if r.Err != nil && err == nil {
				err = r.Err
			}
		}
		err = s.observeScript(ctx, "release", start, err)
		if err != nil {
			// Keys that did succeed are released; a retry with the same
			// reports finds nothing more to do for them.
			return nil, toStatus(err)
		}
		for i, r := range results {
			if r.Reply.Conflict {
				conflicts = append(conflicts, plans[i].key.String())
			}
			s.active.release(plans[i].key)
			total += r.Reply.Returned
		}
	}
	s.metrics.released.Add(float64(total))
	if len(conflicts) > 0 {
		return nil, toStatus(fmt.Errorf("keys %v: %w", conflicts, errConflict))
	}
	return &sluicev1.ReleaseResponse{Returned: total}, nil
}

// Check implements LeaseService.Check, the strict path.
func (s *Server) Check(ctx context.Context, req *sluicev1.CheckRequest) (resp *sluicev1.CheckResponse, err error) {
	defer s.observe("Check", time.Now(), &err)
	start := time.Now()
	p, err := s.plan(s.opts.Config.Current(), req.GetKey(), "key")
	if err != nil {
		return nil, toStatus(err)
	}
	cost := req.GetCost()
	if err := quota.ValidateCost(cost); err != nil {
		return nil, toStatus(err)
	}
	if cost > p.res.Limit.Burst {
		return nil, toStatus(fmt.Errorf("%w: cost %d exceeds the burst %d of %s: it could never be admitted",
			quota.ErrInvalid, cost, p.res.Limit.Burst, p.key))
	}
	s.lookFirst(ctx)
	var cr luascripts.CheckReply
	err = s.call(ctx, p.keys.Bucket, func(ctx context.Context, pipe redis.Pipeliner) *luascripts.Queued {
		return s.scripts.QueueCheck(ctx, pipe, p.keys, p.common, cost)
	}, func(q *luascripts.Queued) (err error) {
		cr, err = luascripts.ParseCheck(q)
		return err
	})
	err = s.observeScript(ctx, "check", start, err)
	if err != nil {
		return nil, toStatus(err)
	}
	s.active.mark(p.key)
	if cr.Reclaimed > 0 {
		s.metrics.reclaimed.Add(float64(cr.Reclaimed))
	}
	result := "allowed"
	if !cr.Allowed {
		result = "denied"
		if p.res.Shadow {
			result = "shadow_denied"
		}
	}
	s.metrics.decisions.WithLabelValues(p.key.Class, p.res.Tier, result).Inc()
	return reply.Check(p.res, cr, s.opts.Unleased), nil
}

func (s *Server) observe(method string, start time.Time, err *error) {
	s.metrics.rpcSeconds.WithLabelValues(method).Observe(time.Since(start).Seconds())
	s.metrics.requests.WithLabelValues(method, status.Code(*err).String()).Inc()
}

// observeScript records a script call made for a caller whose context is
// ctx, and returns the error to answer with.
//
// Only the caller's own context says whether the caller gave up (its
// deadline, or it went away) before Redis answered: that is no evidence
// that Redis failed, and routine when an instance's own timeout is short.
// A context error while the caller still waits is the server's own bound
// on Redis running out (RedisTimeout on a batch, the client's timeouts): a
// Redis that does not answer, counted as a Redis error and answered as
// one (rpcerr.RedisFailedStatus: Unavailable, saying the service
// answered), never as the caller's DeadlineExceeded. A script
// that ran after its deadline (luascripts.ErrTooLate: the static lease it
// was handed its share under had ended) is a Redis that did not answer in
// time too, and answered the same way.
func (s *Server) observeScript(ctx context.Context, script string, start time.Time, err error) error {
	s.metrics.scriptSeconds.WithLabelValues(script).Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
	case ctx.Err() != nil:
		s.log.Debug("caller gave up before redis answered", "script", script, "err", err)
	default:
		s.metrics.redisErrors.WithLabelValues(script).Inc()
		if ok, leftOut := s.scriptLog.Allow(script, time.Now()); ok {
			s.log.Warn("redis script failed", "script", script, "err", ExplainRedisErr(err),
				"failed_unlogged", leftOut)
		}
		node := ""
		if nf := (*nodeFailure)(nil); errors.As(err, &nf) {
			node = nf.node
		}
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, luascripts.ErrTooLate) {
			return &redisFailure{err: fmt.Errorf("redis did not answer the %s script in time: %v", script, err), node: node}
		}
		return &redisFailure{err: err, node: node}
	}
	return err
}

// observeOwn records a Redis call the replica makes on its own, with no
// caller waiting on it (the readiness ping, the restart sentinel, the
// region leader's reads and writes), under script. parent is the context
// of the loop that made it: an error while that loop still runs is Redis
// failing, whatever the call's own bound, and is counted as a Redis error.
// A hung Redis that every caller gives up on is counted here: the callers'
// calls are not (observeScript).
func (s *Server) observeOwn(parent context.Context, script string, start time.Time, err error) {
	if parent.Err() != nil {
		return
	}
	s.metrics.scriptSeconds.WithLabelValues(script).Observe(time.Since(start).Seconds())
	if err != nil {
		s.metrics.redisErrors.WithLabelValues(script).Inc()
	}
}

// toStatus maps an error to a gRPC status at the edge.
func toStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, quota.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, errConflict):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, errRegionRemoved):
		return status.Error(codes.FailedPrecondition, err.Error())
	case isNodeFailure(err):
		// Before the context cases: only a failure the caller still
		// waited for is one (observeScript).
		return rpcerr.RedisNodeFailedStatus(err)
	case isRedisFailure(err):
		return rpcerr.RedisFailedStatus(err)
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	default:
		return status.Error(codes.Unavailable, err.Error())
	}
}

// Close stops the server's Redis batching workers. In-flight calls finish.
func (s *Server) Close() {
	s.batch.close()
	if s.nodes != nil {
		s.nodes.close()
	}
}

// lookFirst makes the restart guard's first look at Redis before a call's
// scripts run, when the look at start did not answer (a Redis, or a
// machine, too slow for the stamp's timeout). Until it is made, the first
// call on a data set with no sentinel writes one dated now and its buckets
// start empty: right for a data set lost while the process runs, but under
// -cold-start full the process has then not had its first look, and held a
// fresh deployment's first keys empty for one restart wait
// (docs/architecture.md, "Redis (or one Redis Cluster node) restarts
// empty"). One look is in flight at a time, bounded by RedisTimeout; a
// caller waits for it at most until its own context ends, and a look that
// fails leaves the calls to the conservative dating of the scripts.
// Under the default cold start a first look dates a missing sentinel now,
// as the scripts do: nothing is won by waiting for it, and while Redis
// does not answer each call would wait twice, so only -cold-start full
// looks first.
func (s *Server) lookFirst(ctx context.Context) {
	g := s.opts.Guard
	if g.Looked() || g.mode != ColdStartFull {
		return
	}
	s.lookMu.Lock()
	if done := s.looking; done != nil {
		s.lookMu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
		}
		return
	}
	done := make(chan struct{})
	s.looking = done
	s.lookMu.Unlock()
	defer func() {
		s.lookMu.Lock()
		s.looking = nil
		s.lookMu.Unlock()
		close(done)
	}()
	lctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
	defer cancel()
	start := time.Now()
	err := g.Check(lctx, s.opts.Redis)
	s.observeOwn(ctx, "sentinel", start, err)
	if err != nil {
		s.log.Debug("restart sentinel first look failed before a call", "err", ExplainRedisErr(err))
	}
}

// Run does the replica's background work until ctx ends: every interval
// it forgets the keys it no longer serves (its in-memory index, for its
// lease gauges) and re-reads the restart sentinel. interval is usually the config's epoch.
// Unless Unleased, it also reads the static lease and Redis TIME every
// quarter epoch.
func (s *Server) Run(ctx context.Context, interval time.Duration) error {
	if sub, ok := s.opts.Config.(notifyingSource); ok {
		done := make(chan struct{})
		actx, stop := context.WithCancel(ctx)
		go func() { defer close(done); s.adoptDelivered(actx, sub) }()
		defer func() { stop(); <-done }()
	}
	if !s.opts.Unleased {
		done := make(chan struct{})
		sctx, stop := context.WithCancel(ctx)
		go func() { defer close(done); s.followStatic(sctx) }()
		defer func() { stop(); <-done }()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.tick(ctx, interval)
		}
	}
}

// notifyingSource is a ConfigSource that says when its config changes
// (configstore.Watcher).
type notifyingSource interface {
	Subscribe() (<-chan *config.Config, func())
}

// adoptDelivered adopts every config the source delivers as it arrives,
// until ctx ends. Without it a replica adopts a config at its first call
// under it (staticChain) or at its next confirmation read (an epoch, see
// followConfirmations): an idle replica's chain, and what Options.OnChain
// shows, would lag its watch by up to an epoch, though nothing is served
// under the old chain meanwhile.
func (s *Server) adoptDelivered(ctx context.Context, src notifyingSource) {
	ch, cancel := src.Subscribe()
	defer cancel()
	s.staticChain() // a change between New and the subscription
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
			s.staticChain()
		}
	}
}

func (s *Server) tick(ctx context.Context, interval time.Duration) {
	// Keys not served since the last tick with no live lease left are
	// forgotten: the index holds live keys only.
	defer s.active.prune(time.Now(), time.Duration(s.opts.Config.Current().LeaseTTL))
	if s.opts.Guard != nil {
		start := time.Now()
		err := s.opts.Guard.Check(ctx, s.opts.Redis)
		s.observeOwn(ctx, "sentinel", start, err)
		switch {
		case ctx.Err() != nil:
		case err != nil && !s.sentinelFailing:
			s.sentinelFailing = true
			// Checked again every epoch; logged again once it answers.
			s.log.Warn("restart sentinel check failed", "err", ExplainRedisErr(err))
		case err != nil:
			s.log.Debug("restart sentinel check failed", "err", ExplainRedisErr(err))
		case s.sentinelFailing:
			s.sentinelFailing = false
			s.log.Info("restart sentinel check answering again")
		}
	}
}
