package scenario

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/config"
)

// ErrInvalid is wrapped by every error that means "this scenario cannot
// run".
var ErrInvalid = errors.New("invalid scenario")

// Duration and Rate use the config package's YAML syntax.
type (
	Duration = config.Duration
	Rate     = config.Rate
)

// Scenario is one simulation. Not safe for concurrent modification.
type Scenario struct {
	// Name identifies the scenario in reports. Required.
	Name string `yaml:"name"`
	// Description says what question the scenario answers. Optional.
	Description string `yaml:"description,omitempty"`
	// Duration is the virtual time simulated. Required, at most
	// MaxDuration.
	Duration Length `yaml:"duration"`
	// Warmup is left out of the measures (not of the invariants): the
	// system starting from nothing is not the steady state being measured.
	// Optional, default 20s (at most half of Duration), shorter than
	// Duration (else nothing would be measured); 0s measures from the start.
	Warmup Length `yaml:"warmup,omitempty"`
	// NoWarmup says Warmup was written 0 (no default applies). Parse sets
	// it.
	NoWarmup bool `yaml:"-"`
	// warmupDefault says Warmup was left out and took its default, which
	// a shortened run (WithDuration) takes again for its own duration.
	warmupDefault bool
	// Seed drives every random choice. Optional, default 1; seeds start
	// at 1. The -seed flag overrides it.
	Seed uint64 `yaml:"seed,omitempty"`
	// written holds the field paths ("workload[0].cost") the document
	// wrote. A default replaces only a field left out: one written 0
	// where 0 is no value the field takes is refused, not defaulted.
	written map[string]bool
	// Sluice is the Sluice configuration (DESIGN §5) the daemons run,
	// validated by pkg/config. Required.
	Sluice yaml.Node `yaml:"sluice"`
	// src is the document Parse read, for the sluice block's lines.
	src []byte
	// Topology is where everything runs. Required.
	Topology Topology `yaml:"topology"`
	// Client tunes the instances' lease client. Optional.
	Client Client `yaml:"client,omitempty"`
	// Workload is the offered traffic. Required, at least one entry.
	Workload []Workload `yaml:"workload"`
	// Faults are injected at fixed times. Optional.
	Faults []Fault `yaml:"faults,omitempty"`
	// Chaos adds random faults drawn from the seed. Optional.
	Chaos *Chaos `yaml:"chaos,omitempty"`
	// Failovers move a region's users elsewhere at given times. Optional.
	Failovers []Failover `yaml:"failovers,omitempty"`
	// Events are operator actions at given times (config changes).
	// Optional.
	Events []Event `yaml:"events,omitempty"`
	// Expect are the targets the run must meet. Optional; the three
	// invariants are always required to hold.
	Expect Expect `yaml:"expect,omitempty"`
	// Focus lists keys ("tenant/class") charted in the report, each one a
	// workload offers. Optional, default the three keys with the most
	// offered traffic.
	Focus []string `yaml:"focus,omitempty"`

	// Config is Sluice parsed and validated (set by Validate).
	Config *config.Config `yaml:"-"`
}

// Topology is the deployment the scenario runs on.
type Topology struct {
	// Regions in display order. Required; the same set as the Sluice
	// config's regions.
	Regions []RegionSpec `yaml:"regions"`
	// Global says where the global allocator's replicas run. Required.
	Global GlobalSpec `yaml:"global"`
	// Latency is the network. Optional, defaults below.
	Latency Latency `yaml:"latency,omitempty"`
	// SessionTTL is the etcd session TTL of every elected leader (global
	// and regional): how long a crashed leader blocks its successor.
	// Optional, default 5s.
	SessionTTL Duration `yaml:"session_ttl,omitempty"`
	// ColdStart is how the regional service treats the empty Redis it
	// starts on: "full" (a fresh deployment, buckets start full) or
	// "conservative" (buckets start empty for one lease TTL). Optional,
	// default full.
	ColdStart string `yaml:"cold_start,omitempty"`
	// InstanceClockSkew bounds each instance's random clock offset from its
	// region's clock (uniform in ±skew). Optional, default 0.
	InstanceClockSkew Duration `yaml:"instance_clock_skew,omitempty"`
}

// RegionSpec is one region's deployment.
type RegionSpec struct {
	// Name is a region of the Sluice config. Required.
	Name string `yaml:"name"`
	// Instances is how many application instances run there. Required,
	// >= 1.
	Instances int `yaml:"instances"`
	// ClockOffset is the region's clock (its Redis TIME) minus true time.
	// Optional, may be negative, written as a string like "-120ms".
	ClockOffset SignedDuration `yaml:"clock_offset,omitempty"`
}

// GlobalSpec places the global allocator's leader and standby.
type GlobalSpec struct {
	// Primary is the region the first leader runs in. Required.
	Primary string `yaml:"primary"`
	// Standby is the region of the standby replica. Optional (no
	// failover without one).
	Standby string `yaml:"standby,omitempty"`
}

// Latency is the simulated network.
type Latency struct {
	// Local is the one-way latency between an instance and its regional
	// service. Optional, default 500µs.
	Local Duration `yaml:"local,omitempty"`
	// Default is the one-way latency between two regions not in Pairs.
	// Optional, default 50ms.
	Default Duration `yaml:"default,omitempty"`
	// Pairs gives one-way latencies by "a/b" (either order; a pair
	// written in both orders is refused). Optional.
	Pairs map[string]Duration `yaml:"pairs,omitempty"`
	// Jitter is the relative spread of every latency (uniform ±). Optional,
	// default 0.1, in [0, 1).
	Jitter *float64 `yaml:"jitter,omitempty"`
	// Loss is the probability that a message between regions is lost.
	// Optional, default 0, in [0, 1).
	Loss float64 `yaml:"loss,omitempty"`
}

// Client tunes the lease client of every instance (pkg/lease Options).
type Client struct {
	// BreakerTimeout bounds a synchronous acquire. Optional, default 50ms.
	BreakerTimeout Duration `yaml:"breaker_timeout,omitempty"`
	// BreakerFailures opens the breaker. Optional, default 3.
	BreakerFailures int `yaml:"breaker_failures,omitempty"`
	// BreakerCooldown is how long the open breaker skips calls. Optional,
	// default 1s.
	BreakerCooldown Duration `yaml:"breaker_cooldown,omitempty"`
}

// Workload is traffic of one tenant (or a generated group of tenants) on
// one class.
type Workload struct {
	// Tenant is one tenant id; exactly one of Tenant and Group is set.
	Tenant string `yaml:"tenant,omitempty"`
	// Group generates many tenants with heavy-tailed sizes.
	Group *Group `yaml:"group,omitempty"`
	// Class is a configured class. Required.
	Class string `yaml:"class"`
	// Cost is the tokens each request costs, at most the burst of every
	// key the workload drives (a request above it is refused as invalid
	// input, never admitted). Optional, default 1; written, at least 1.
	Cost int64 `yaml:"cost,omitempty"`
	// Process is "poisson" (random arrivals, the default) or "constant"
	// (evenly spaced).
	Process string `yaml:"process,omitempty"`
	// Rate is the base request rate per region (Tenant only). Required for
	// a tenant; every region not listed gets none.
	Rate map[string]Rate `yaml:"rate,omitempty"`
	// PerInstance is the request rate one instance takes of this traffic
	// before the load balancer spreads it over another instance of the
	// region. Optional, default: every instance of the region shares it;
	// written, positive.
	PerInstance Rate `yaml:"per_instance,omitempty"`
	// Shape varies the rate over time; factors of all entries multiply.
	// Optional.
	Shape []Shape `yaml:"shape,omitempty"`
}

// Group is a set of generated tenants "<prefix><n>" with heavy-tailed
// sizes (the total request rate of each tenant).
type Group struct {
	// Prefix of the tenant ids. Required.
	Prefix string `yaml:"prefix"`
	// Count of tenants. Required, 1..100000.
	Count int `yaml:"count"`
	// Tier the tenants are listed with in the config. Optional, default
	// the config's default tier.
	Tier string `yaml:"tier,omitempty"`
	// Size draws each tenant's total request rate. Required.
	Size Size `yaml:"size"`
	// HomeShare is the fraction of a tenant's traffic in its home region
	// (drawn by region weight); the rest is split over the tenant's other
	// regions by weight. Optional, default 0: split by weight, no home.
	HomeShare float64 `yaml:"home_share,omitempty"`
	// Regions is how many regions each tenant's traffic reaches: its home
	// and others drawn by weight. Optional, default all.
	Regions int `yaml:"regions,omitempty"`
}

// Size is a distribution of tenant sizes in requests per second.
type Size struct {
	// Dist is "pareto" (heavy-tailed), "lognormal" or "fixed". Required.
	Dist string `yaml:"dist"`
	// Min is the smallest size (pareto scale; fixed value). Required.
	Min Rate `yaml:"min"`
	// Max truncates the distribution. Optional (no truncation).
	Max Rate `yaml:"max,omitempty"`
	// Alpha is the pareto tail index (> 0; smaller is heavier). Default 1.2.
	Alpha float64 `yaml:"alpha,omitempty"`
	// Sigma is the lognormal spread (of ln size). Default 1.
	Sigma float64 `yaml:"sigma,omitempty"`
}

// Shape kinds.
const (
	ShapeStep    = "step"
	ShapeDiurnal = "diurnal"
	ShapeFlash   = "flash"
)

// Shape is one time-varying factor on a workload's rate. A field its
// kind does not read (a hold on a step, a period on a flash crowd, ...) is
// refused: a step reads regions, at and factor; a flash crowd those and
// rise, hold and decay; a diurnal shape regions, period, low, peaks and
// steps.
type Shape struct {
	// Kind is step, diurnal or flash. Required.
	Kind string `yaml:"kind"`
	// Regions the factor applies to. Optional, default all.
	Regions []string `yaml:"regions,omitempty"`
	// At is when a step happens or a flash crowd starts, before the end
	// of the run. Required for step and flash.
	At Instant `yaml:"at,omitempty"`
	// Factor is the step's multiplier from At on, in [0, 1e6] (0: no
	// traffic from At on), or the flash crowd's peak multiplier, in
	// (0, 1e6]. Required for step and flash.
	Factor float64 `yaml:"factor,omitempty"`
	// Rise, Hold and Decay shape a flash crowd: linear rise to Factor,
	// hold, linear decay back to 1. Optional, default 0 (instant) for Rise
	// and Decay; Hold is required.
	Rise  Duration `yaml:"rise,omitempty"`
	Hold  Duration `yaml:"hold,omitempty"`
	Decay Duration `yaml:"decay,omitempty"`
	// Period of a diurnal cycle ("a day", compressed). Required for
	// diurnal, at least MinDiurnalPeriod (1s).
	Period Duration `yaml:"period,omitempty"`
	// Low is the diurnal factor at night (the peak is 1). Optional,
	// default 0.1, in [0, 1].
	Low *float64 `yaml:"low,omitempty"`
	// Peaks gives each region's local noon as an offset into the period,
	// in [0, Period).
	// Optional, default: regions peak one after another, evenly spaced in
	// topology order (follow the sun).
	Peaks map[string]Length `yaml:"peaks,omitempty"`
	// Steps quantizes the cycle into this many constant steps per period
	// ("the sun moves hour by hour"); each step is a demand shift, and
	// lasts at least MinDiurnalStep (100ms). Optional, default 0 (smooth).
	Steps int `yaml:"steps,omitempty"`
}

// Fault kinds.
const (
	FaultInstanceCrash    = "instance-crash"
	FaultInstanceStop     = "instance-stop"
	FaultRegionLeaderLoss = "region-leader-loss"
	FaultGlobalLeaderLoss = "global-leader-loss"
	FaultPartition        = "partition"
	FaultRedisRestart     = "redis-restart"
	FaultEtcdDown         = "etcd-down"
	FaultLatency          = "latency"
	FaultLoss             = "loss"
	// Replays, lost answers and stale grants.
	FaultReplyLoss          = "reply-loss"
	FaultReportReplay       = "report-replay"
	FaultRegionReportReplay = "region-report-replay"
	FaultStaleLeader        = "stale-leader"
	FaultInstanceIsolate    = "instance-isolate"
	// Whole-region failure.
	FaultRegionDown = "region-down"
)

// FaultKinds lists every fault kind.
func FaultKinds() []string {
	return append(ChaosKinds(), FaultReplyLoss, FaultReportReplay, FaultRegionReportReplay, FaultStaleLeader,
		FaultInstanceIsolate, FaultRegionDown)
}

// ChaosKinds are the kinds chaos draws from by default.
func ChaosKinds() []string {
	return []string{FaultInstanceCrash, FaultInstanceStop, FaultRegionLeaderLoss, FaultGlobalLeaderLoss,
		FaultPartition, FaultRedisRestart, FaultEtcdDown, FaultLatency, FaultLoss}
}

// Fault is one injected failure.
//
//	instance-crash      Count instances of Region die without releasing;
//	                    replacements start RestartAfter later (if set).
//	instance-stop       Count instances of Region shut down gracefully,
//	                    as the agent does: no new request, those in
//	                    flight decided, then the lease client closes
//	                    (releases everything); replacements as above.
//	instance-isolate    Count instances of Region lose their link to the
//	                    region's service for For: their Syncs and Acquires
//	                    time out; they serve from their leases until the
//	                    deadlines, then by their classes' on_failure. A
//	                    lease the region reaps meanwhile gives back tokens
//	                    the instance spent but could not report: ε.
//	region-leader-loss  Region's leader replica dies; another replica is
//	                    elected once its etcd session expires.
//	global-leader-loss  The global leader dies; the standby takes over once
//	                    its session expires; the old one returns as the
//	                    standby RestartAfter later (default 1m).
//	partition           Region cannot reach the global tier (both ways)
//	                    for For.
//	redis-restart       Region's Redis is down for For and comes back empty.
//	etcd-down           etcd is unreachable for For.
//	latency             The one-way latency between Region and Peer (a
//	                    region, or "global" for wherever the global leader
//	                    runs) is Latency for For (0: for the rest of the run).
//	loss                Messages between regions are lost with probability
//	                    Loss for For.
//	reply-loss          For For, each answer of Region's service to an
//	                    instance is lost with probability Loss after the
//	                    request was applied: the instance times out and
//	                    retries.
//	report-replay       For For, each lease report (Acquire, Sync,
//	                    Release) of Region's instances is delivered again
//	                    with probability Loss, up to two refreshes later.
//	region-report-replay  For For, every report of Region's leader to the
//	                    global tier is delivered twice.
//	stale-leader        Region's leader pauses for For: another replica is
//	                    elected, and the old one, waking up, installs the
//	                    last answer it had (grants reach Redis out of
//	                    order).
//	region-down         Region dies whole: every instance crashes, its
//	                    regional service (leader and replicas) stops, the
//	                    global tier replicas running there crash, and its
//	                    link to the global tier is gone. With RestartAfter
//	                    it comes back that much later (instances, service,
//	                    a new region leader) with its Redis as it was, or
//	                    empty with RedisLost; without, it stays dead.
//
// A field the fault's kind does not read (a For on an instance crash or a
// region-down, a RestartAfter on a partition, ...) is refused.
type Fault struct {
	// At is when the fault starts. Required.
	At Instant `yaml:"at"`
	// Kind is one of the fault kinds. Required.
	Kind string `yaml:"kind"`
	// Region the fault hits (instance, region-leader, partition,
	// redis-restart, latency faults). Required for those.
	Region string `yaml:"region,omitempty"`
	// Peer is the other end of a latency fault. Required for latency.
	Peer string `yaml:"peer,omitempty"`
	// Count of instances hit. Optional, default 1; written, 1..10000.
	Count int `yaml:"count,omitempty"`
	// For is how long the fault lasts. Required for partition,
	// redis-restart, etcd-down and loss; optional for latency.
	For Duration `yaml:"for,omitempty"`
	// RestartAfter starts replacements (instance faults), brings the old
	// global leader back as standby, or brings a region-down region back.
	// Optional.
	RestartAfter Duration `yaml:"restart_after,omitempty"`
	// Latency is the new one-way latency of a latency fault.
	Latency Duration `yaml:"latency,omitempty"`
	// Loss is the probability of a loss, reply-loss or report-replay
	// fault, in (0, 1].
	Loss float64 `yaml:"loss,omitempty"`
	// RedisLost: a region-down region comes back with an empty Redis
	// (its data lost with the region). Optional, default false (Redis
	// as it was: persisted, or only unreachable). Needs RestartAfter.
	RedisLost bool `yaml:"redis_lost,omitempty"`
}

// Failover moves a region's users to other regions: from At on, the
// traffic every workload offers in From arrives in To instead, split over
// To by region weight (each moved stream keeps its own shape, as its users'
// habits do not change with the region serving them). With For, the users
// move back For later.
type Failover struct {
	// At is when the users move. Required.
	At Instant `yaml:"at"`
	// From is the region they leave. Required.
	From string `yaml:"from"`
	// To are the regions taking them. Required, at least one, not From.
	To []string `yaml:"to"`
	// For is how long until they move back. Optional, default for the
	// rest of the run.
	For Duration `yaml:"for,omitempty"`
}

// Event kinds.
const (
	// EventDrain sets regions.<Region>.drained in the Sluice config.
	EventDrain = "drain"
	// EventRestore clears it.
	EventRestore = "restore"
)

// Event is an operator's config change at a given time: a new config
// revision written to etcd, which every region adopts when its watch
// delivers it (not while etcd is unreachable to it or the region is
// down) and the global tier when its leader next reads it.
type Event struct {
	// At is when the change is written. Required.
	At Instant `yaml:"at"`
	// Kind is drain or restore. Required.
	Kind string `yaml:"kind"`
	// Region is the region drained or restored. Required.
	Region string `yaml:"region"`
}

// Chaos draws random faults from the seed: starting at Start, gaps between
// fault starts are exponential with mean MeanGap, kinds uniform over
// Kinds, targets uniform over regions, durations uniform in [MinFor,
// MaxFor].
type Chaos struct {
	// Start of the first possible fault. Optional, default Warmup.
	Start Duration `yaml:"start,omitempty"`
	// End of the last possible fault start. Optional, default Duration -
	// MaxFor - 1m.
	End Duration `yaml:"end,omitempty"`
	// MeanGap between fault starts. Required; at least 1ms, and at most
	// MaxChaosFaults on average between Start and End.
	MeanGap Duration `yaml:"mean_gap"`
	// Kinds to draw from. Optional, default every kind.
	Kinds []string `yaml:"kinds,omitempty"`
	// MinFor and MaxFor bound fault durations. Optional, default 10s and 60s.
	MinFor Duration `yaml:"min_for,omitempty"`
	MaxFor Duration `yaml:"max_for,omitempty"`
	// RestartAfter for instance faults. Optional, default 20s.
	RestartAfter Duration `yaml:"restart_after,omitempty"`
	// endDefault says End was left out and is its default.
	endDefault bool
}

// Expect are a run's targets. Unset fields are not checked.
type Expect struct {
	// ConformanceViolationsMax bounds invariant 1 violations beyond the
	// crash error. Optional, default 0.
	ConformanceViolationsMax *int `yaml:"conformance_violations_max,omitempty"`
	// RateViolationsMax bounds invariant 2 violations. Optional, default 0.
	RateViolationsMax *int `yaml:"rate_violations_max,omitempty"`
	// BurstViolationsMax bounds invariant 3 violations. Optional, default 0.
	BurstViolationsMax *int `yaml:"burst_violations_max,omitempty"`
	// Utilization60sMin is the lowest allowed utilization of any 60 s
	// window after warmup (admitted / min(offered, limit)).
	Utilization60sMin *float64 `yaml:"utilization_60s_min,omitempty"`
	// Utilization1sMeanMin is the lowest allowed mean 1 s utilization.
	Utilization1sMeanMin *float64 `yaml:"utilization_1s_mean_min,omitempty"`
	// ConvergenceEpochsMax bounds the convergence time after any demand
	// shift, in epochs. A shift the key's next shift (or the run's end)
	// cuts short before it converged is judged only when it was watched
	// for at least this many epochs.
	ConvergenceEpochsMax *float64 `yaml:"convergence_epochs_max,omitempty"`
	// ConvergenceTolerance is how close (fraction of the key's rate) every
	// region's refill rate must come to its fair share to count as
	// converged. Optional, default 0.05.
	ConvergenceTolerance float64 `yaml:"convergence_tolerance,omitempty"`
	// FalseRejectsMax bounds false rejects as a fraction of offered tokens.
	FalseRejectsMax *float64 `yaml:"false_rejects_max,omitempty"`
	// FairnessErrorMax bounds the mean weighted max-min fairness error of
	// every region (fraction of the key's rate).
	FairnessErrorMax *float64 `yaml:"fairness_error_max,omitempty"`
	// ReclaimMax bounds the time from an instance crash until the region
	// reclaimed the last of its leases.
	ReclaimMax Duration `yaml:"reclaim_max,omitempty"`
	// CrashErrorMax bounds ε, the tokens crashed instances spent but never
	// reported, as a fraction of admitted tokens.
	CrashErrorMax *float64 `yaml:"crash_error_max,omitempty"`
	// Recovery is the time the system is given after every change (a
	// fault's start and end, a failover, an event) before the recovered
	// measures count again. Required by the two targets below.
	Recovery Duration `yaml:"recovery,omitempty"`
	// RecoveredVsIdealMin is the lowest allowed ratio of admitted tokens to
	// what an ideal central bucket admits of the same arrivals, over the
	// time after warmup outside every change's recovery window.
	RecoveredVsIdealMin *float64 `yaml:"recovered_vs_ideal_min,omitempty"`
	// RecoveredFalseRejectsMax bounds false rejects (fraction of offered
	// tokens) over the same time.
	RecoveredFalseRejectsMax *float64 `yaml:"recovered_false_rejects_max,omitempty"`
}

// Length is a length of the run ("5m"), read as a duration is; a value
// too large for one is out of range.
type Length time.Duration

// String is time.Duration's form.
func (d Length) String() string { return time.Duration(d).String() }

// UnmarshalYAML reads a length.
func (d *Length) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: a duration must be a scalar like 5m", n.Line)}}
	}
	v, err := time.ParseDuration(n.Value)
	switch {
	case err != nil && config.DurationSyntax(n.Value):
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: duration %q is out of range (a run is at most %v)", n.Line, n.Value, MaxDuration)}}
	case err != nil:
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: duration %q: want a number with a unit, like 5m", n.Line, n.Value)}}
	case v < 0:
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: duration %q must not be negative", n.Line, n.Value)}}
	}
	*d = Length(v)
	return nil
}

// MarshalYAML writes time.Duration's form.
func (d Length) MarshalYAML() (any, error) { return d.String(), nil }

// Instant is a time in the run, since its start ("1m30s"): when a fault,
// a failover, an event or a step happens. A written instant is positive.
type Instant time.Duration

// String is time.Duration's form.
func (t Instant) String() string { return time.Duration(t).String() }

// UnmarshalYAML reads an instant.
func (t *Instant) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: a time must be a scalar like 1m30s", n.Line)}}
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: time %q: want a time since the start of the run, like 1m30s", n.Line, n.Value)}}
	}
	if v <= 0 {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: time %q must be after the start of the run, like 1m30s", n.Line, n.Value)}}
	}
	*t = Instant(v)
	return nil
}

// MarshalYAML writes time.Duration's form.
func (t Instant) MarshalYAML() (any, error) { return t.String(), nil }

// SignedDuration is a duration that may be negative ("-120ms").
type SignedDuration time.Duration

// UnmarshalYAML reads a signed duration.
func (d *SignedDuration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: a duration must be a scalar like -120ms", n.Line)}}
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: duration %q: want a number with a unit, like -120ms", n.Line, n.Value)}}
	}
	*d = SignedDuration(v)
	return nil
}

// MarshalYAML writes time.Duration's form.
func (d SignedDuration) MarshalYAML() (any, error) { return time.Duration(d).String(), nil }

// Parse reads one scenario document strictly (unknown fields are errors),
// applies defaults and validates it. Every error wraps ErrInvalid; the
// decoder's problems are worded as the Sluice config's are ("unknown
// field \"warmpu\" (line 10)"), and lines count from the file's start,
// inside the sluice block too.
func Parse(data []byte) (*Scenario, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Scenario
	if err := dec.Decode(&s); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the document is empty", ErrInvalid)
		}
		paths := fieldPaths(data)
		var msgs []string
		for _, m := range config.YAMLMessages(err) {
			msgs = append(msgs, tabLine(rangeMessage(m), data))
		}
		var out []error
		for i, m := range msgs {
			// Several fields on one line alike in value ("{local: 0s,
			// default: 0s}") have one message each, alike too, in the
			// document's order: the n-th names the n-th field.
			n, alike := 0, 0
			for j, o := range msgs {
				if o == m {
					alike++
					if j < i {
						n++
					}
				}
			}
			if path := paths.of(m, n, alike); path != "" {
				m = path + ": " + m
			} else if n > 0 {
				continue // said once is enough
			}
			out = append(out, fmt.Errorf("%w: %s", ErrInvalid, m))
		}
		return nil, errors.Join(out...)
	}
	s.src = data
	s.written = map[string]bool{}
	for _, paths := range fieldPaths(data) {
		for _, p := range paths {
			s.written[p] = true
		}
	}
	s.NoWarmup = s.wrote("warmup") && s.Warmup == 0
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: want exactly one YAML document", ErrInvalid)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Load reads and parses a scenario file.
func Load(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", path, err)
	}
	return s, nil
}

// WithDuration returns a copy of s that runs for d: faults, failovers,
// events and shape steps and flash crowds starting at or after d are
// dropped. A written warmup is kept, so
// a shorter run measures what the scenario measures, only less of it; d
// must be longer than it (else nothing would be measured, and a shortened
// warmup would measure the start-up the scenario leaves out). A warmup
// left out takes its default again, for d. d must be positive.
func (s *Scenario) WithDuration(d time.Duration) (*Scenario, error) {
	if d <= 0 {
		return nil, fmt.Errorf("%w: duration %v must be positive", ErrInvalid, d)
	}
	if d > MaxDuration {
		return nil, fmt.Errorf("%w: duration %v is more than the longest run, %v", ErrInvalid, d, MaxDuration)
	}
	c := *s
	c.Duration = Length(d)
	// The copy's lists are shorter, so the written paths' indices would
	// name other entries. s passed validation: every default it takes is
	// applied and no field of it is written 0 where 0 is refused.
	c.written = nil
	if s.warmupDefault {
		c.Warmup = Length(min(DefaultWarmup, d/2))
	} else if w := time.Duration(s.Warmup); w > 0 && d <= w {
		return nil, fmt.Errorf("%w: duration %v is not longer than the scenario's warmup, %v, which is kept (measures and targets start after it): nothing would be measured; run longer than %v", ErrInvalid, d, w, w)
	}
	c.Faults = nil
	for _, f := range s.Faults {
		if time.Duration(f.At) < d {
			c.Faults = append(c.Faults, f)
		}
	}
	c.Failovers = nil
	for _, f := range s.Failovers {
		if time.Duration(f.At) < d {
			c.Failovers = append(c.Failovers, f)
		}
	}
	c.Workload = make([]Workload, len(s.Workload))
	for i, w := range s.Workload {
		w.Shape = nil
		for _, sh := range s.Workload[i].Shape {
			if sh.Kind == ShapeDiurnal || time.Duration(sh.At) < d {
				w.Shape = append(w.Shape, sh)
			}
		}
		c.Workload[i] = w
	}
	c.Events = nil
	for _, e := range s.Events {
		if time.Duration(e.At) < d {
			c.Events = append(c.Events, e)
		}
	}
	if s.Chaos != nil {
		ch := *s.Chaos
		if time.Duration(ch.End) > d {
			ch.End = 0 // recomputed from the new duration
		}
		c.Chaos = &ch
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// wrote says the document wrote the field at path ("faults[2].count").
func (s *Scenario) wrote(path string) bool { return s.written[path] }

// fieldIndex maps the values and keys of a document to their field paths
// ("faults[0].for"), by line and text, so a decoder's message naming a
// line and a value can name the field as validation does.
type fieldIndex map[fieldAt][]string

type fieldAt struct {
	line int
	text string
}

// fieldRole is what a node walkFields visits is to its field path.
type fieldRole int

const (
	roleKey    fieldRole = iota // a mapping's key (the path is its value's)
	roleEntry                   // a sequence's entry
	roleScalar                  // a scalar value (an entry's too)
)

// walkFields visits every field of data (a YAML document) with its path
// ("workload[0].cost") and role; false when data does not parse.
func walkFields(data []byte, visit func(n *yaml.Node, path string, role fieldRole)) bool {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return false
	}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := k.Value
				if path != "" {
					p = path + "." + k.Value
				}
				visit(k, p, roleKey)
				walk(v, p)
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				p := fmt.Sprintf("%s[%d]", path, i)
				visit(c, p, roleEntry)
				walk(c, p)
			}
		case yaml.ScalarNode:
			visit(n, path, roleScalar)
		}
	}
	walk(doc.Content[0], "")
	return true
}

// fieldPaths indexes data's fields, its keys and scalar values, by line
// and text (none when it does not parse).
func fieldPaths(data []byte) fieldIndex {
	idx := fieldIndex{}
	if !walkFields(data, func(n *yaml.Node, path string, role fieldRole) {
		if role != roleEntry {
			idx.add(n, path)
		}
	}) {
		return nil
	}
	return idx
}

// lineIndex maps the field paths of a document to their lines.
type lineIndex map[string]int

// fieldLines indexes data's fields, its keys and entries, by path (none
// when it does not parse).
func fieldLines(data []byte) lineIndex {
	lines := lineIndex{}
	if !walkFields(data, func(n *yaml.Node, path string, role fieldRole) {
		if role != roleScalar {
			lines[path] = n.Line
		}
	}) {
		return nil
	}
	return lines
}

// LineOf is the lookup of a YAML document's field lines by path
// ("faults[0].at"): the line of the field, or of the nearest entry holding
// it, 0 when none is known (or data does not parse). Scenario files of
// other kinds (sim/scale's) name their bad fields' lines with it.
func LineOf(data []byte) func(path string) int { return fieldLines(data).of }

// of is the line of the field at path, or of the nearest entry holding it
// ("workload[0]" for a workload[0].cost left out); 0 when none is known.
func (lines lineIndex) of(path string) int {
	for path != "" {
		if l, ok := lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

func (idx fieldIndex) add(n *yaml.Node, path string) {
	at := fieldAt{n.Line, n.Value}
	idx[at] = append(idx[at], path)
}

var (
	messageLineRE  = regexp.MustCompile(`\(line (\d+)\)$`)
	messageQuoteRE = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)
)

// of is the field a decoder's message ("... \"-5s\" ... (line 12)") is
// about: the one field on its line whose key or value is the first text
// it quotes; when there are several and as many messages alike (alike),
// the n-th of them; "" when none or several are.
func (idx fieldIndex) of(msg string, n, alike int) string {
	lm := messageLineRE.FindStringSubmatch(msg)
	qm := messageQuoteRE.FindStringSubmatch(msg)
	if lm == nil || qm == nil {
		return ""
	}
	line, err := strconv.Atoi(lm[1])
	if err != nil {
		return ""
	}
	text, err := strconv.Unquote(`"` + qm[1] + `"`)
	if err != nil {
		return ""
	}
	if paths := idx[fieldAt{line, text}]; len(paths) == 1 {
		return paths[0]
	} else if len(paths) > 1 && len(paths) == alike && n < alike {
		return paths[n]
	}
	// The decoder cuts a long value short ("9999999..."): the one field
	// on the line whose value starts with what it kept.
	if kept, cut := strings.CutSuffix(text, "..."); cut && kept != "" {
		found := ""
		for at, paths := range idx {
			if at.line != line || !strings.HasPrefix(at.text, kept) {
				continue
			}
			if found != "" || len(paths) != 1 {
				return ""
			}
			found = paths[0]
		}
		return found
	}
	return ""
}

// outOfRangeRE matches the decoder's message for a whole number it could
// not store: only digits (a minus too where the field may be negative), so
// the number is well formed and out of the field's range.
var outOfRangeRE = regexp.MustCompile(`^"(-?[0-9]+(?:\.\.\.)?)" is not a whole number( \(line \d+\))$|^"([0-9]+(?:\.\.\.)?)" is not a whole number, 0 or more( \(line \d+\))$`)

// tabLine corrects the line of the decoder's message about a tab in
// indentation: it names the line before the tab's. The tab's is the first
// line from there on indented with one.
func tabLine(m string, data []byte) string {
	lm := messageLineRE.FindStringSubmatch(m)
	if !strings.Contains(m, "found a tab character") || lm == nil {
		return m
	}
	from, err := strconv.Atoi(lm[1])
	if err != nil {
		return m
	}
	for i, l := range strings.Split(string(data), "\n") {
		if i+1 < from {
			continue
		}
		indent := l[:len(l)-len(strings.TrimLeft(l, " \t"))]
		if strings.ContainsRune(indent, '\t') {
			return messageLineRE.ReplaceAllString(m, fmt.Sprintf("(line %d)", i+1))
		}
	}
	return m
}

// rangeMessage rewords the decoder's "is not a whole number" for a value
// that is one, just out of the field's range, which is what is wrong.
func rangeMessage(m string) string {
	g := outOfRangeRE.FindStringSubmatch(m)
	if g == nil {
		return m
	}
	if g[1] == "" {
		g[1], g[2] = g[3], g[4]
	}
	return fmt.Sprintf("%q is out of range for this field%s", g[1], g[2])
}
