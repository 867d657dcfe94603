package config

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/shard"
)

// ErrInvalidConfig is wrapped by every error that means "this config must
// not be used": bad YAML, unknown fields, and every Validate problem.
var ErrInvalidConfig = errors.New("invalid config")

// Defaults applied by ApplyDefaults (and so by Parse) to fields left out.
const (
	DefaultEpoch    = time.Second
	DefaultLeaseTTL = 5 * time.Second
	DefaultRefresh  = time.Second
	// DefaultGrantValidityEpochs is the grant validity in epochs.
	DefaultGrantValidityEpochs = 5
	// DefaultPrefix is the etcd key prefix used when configstore.NewStore gets "".
	DefaultPrefix = "/sluice"
	// DefaultRegionLease is the region_lease used when it is left out: a
	// partition or global-tier outage shorter than a minute (12 default
	// grant validities) changes nothing, and a dead region's share returns
	// to the others about region_lease + grant_validity + margin after its
	// last report (66 s with the defaults).
	DefaultRegionLease = time.Minute
	// MaxRegionLease bounds region_lease: 2 × MaxInterval, so every
	// accepted grant_validity has a region_lease to go with it.
	MaxRegionLease = 2 * MaxInterval
)

// Config is the whole operator configuration. Not safe for concurrent
// modification; concurrent reads are fine.
//
// Every field's comment ends in a list that docs/config.md is generated
// from (go generate ./pkg/config): Required or Default, Unit where the type
// does not say it, Rule, Example, and Key for maps. A test fails when one
// is missing or the file is stale.
type Config struct {
	// Epoch is the global allocation period P: each region's leader
	// reports demand once per epoch and the global tier re-divides every
	// contended key. Shorter follows demand shifts between regions faster
	// at the cost of one report per region per epoch. A change rebuilds the
	// allocator in learning mode for one grant validity.
	//
	//   - Default: 1s
	//   - Rule: at least 10ms, at most 24h
	//   - Example: 500ms
	Epoch Duration `yaml:"epoch,omitempty"`
	// GrantValidity is how long a region grant stays valid (V): how long a
	// region keeps a share above its static one without hearing from the
	// global tier, and how long capacity stays reserved for a region that
	// went silent. A change rebuilds the allocator in learning mode.
	//
	//   - Default: 5 × epoch
	//   - Rule: at least 4 × epoch (above-share grants end up to 3 epochs
	//     before V), at most 24h
	//   - Example: 10s
	GrantValidity Duration `yaml:"grant_validity,omitempty"`
	// DemandAlpha is the weight of the newest epoch in the global tier's
	// moving average of each region's demand. 1 follows demand within an
	// epoch, so capacity moves a few epochs after a shift; lower values
	// smooth noisy demand and move capacity slower.
	//
	//   - Default: 1
	//   - Unit: weight of the newest epoch (a fraction)
	//   - Rule: in (0, 1]
	//   - Example: 0.5
	DemandAlpha float64 `yaml:"demand_alpha,omitempty"`
	// LeaseTTL is how long an instance lease lives: how long a dead
	// instance's tokens stay stranded (and its demand counted) before they
	// return to the region's bucket.
	//
	//   - Default: 5s
	//   - Rule: more than 2 × refresh, at most 24h
	//   - Example: 10s
	LeaseTTL Duration `yaml:"lease_ttl,omitempty"`
	// Refresh is the instance Sync period: usage reporting granularity and
	// batch size (instances size batches to their rate × 1.5 × refresh)
	// against RPC load (one Sync per instance per refresh). Demand rates
	// are measured over windows of at least refresh / 2.
	//
	//   - Default: 1s
	//   - Rule: at least 10ms (below, instances would spend their time on
	//     Sync round trips); less than lease_ttl / 2, so one lost Sync
	//     never lets a lease lapse; at most 24h
	//   - Example: 500ms
	Refresh Duration `yaml:"refresh,omitempty"`
	// RegionLease is how long a region may run on its static shares after
	// its last answered report (the global tier confers this static lease
	// in every answer). Past it the region runs on its floor (each class's
	// partition_share of its static share), and the global tier, once it
	// has not heard the region for region_lease + grant_validity +
	// max(epoch, 1% of region_lease), reserves only that floor and
	// re-divides the rest. Longer rides out longer partitions but leaves a
	// dead region's share idle longer (66 s with the defaults). A change
	// rebuilds the allocator in learning mode.
	//
	// Keep it at least the global tier's failover bound, session TTL +
	// 0.5 s + 5.25 × epoch (cmd/global -session-ttl, default 5s: 10.75 s
	// with the default epoch): shorter, a global leader that dies without
	// resigning (SIGKILL, a lost node) puts every region on its floor
	// until a leader answers, since a region cannot tell a dead leader
	// from a live one it is cut off from while the dead one's election
	// key stays (docs/architecture.md, The static lease). Not refused
	// (the session TTL is a flag of each global replica, not config):
	// sluicectl validate and apply warn below the bound for the default
	// TTL, and every global replica checks its own on each config it
	// loads (ERROR log, sluice_global_region_lease_below_failover, alert
	// SluiceRegionLeaseBelowFailover).
	//
	//   - Default: 1m, or 2 × grant_validity when that is longer
	//   - Rule: at least 2 × grant_validity, at most 48h; should be at least session TTL + 0.5s + 5.25 × epoch (warned, not refused)
	//   - Example: 5m
	RegionLease Duration `yaml:"region_lease,omitempty"`
	// GlobalShards is how many allocator shards the global tier runs: each
	// owns a range of the key hash space (pkg/shard) with its own election
	// and leader, and each region reports every key to its owner. A change
	// is made before it breaks: every shard only re-issues what regions
	// hold until every region runs the new count and one grant validity
	// has passed (docs/architecture.md, The sharded global tier). Start a
	// shard's replicas before raising the count to include it: until one of
	// them leads, the keys that move to it run on their floor in every region
	// (`sluicectl apply` warns of such a shard).
	//
	//   - Unit: allocator shards
	//   - Default: 1
	//   - Rule: 1..256 (shard.MaxShards)
	//   - Example: 4
	GlobalShards int64 `yaml:"global_shards,omitempty"`
	// Regions maps each region's name to its share of every key's global
	// rate. List every region that runs a regional service.
	//
	//   - Required
	//   - Key: region (e.g. us-east)
	//   - Rule: at least one and at most 64 (MaxRegions); names are 1-128
	//     bytes of letters, digits and . _ : @ -
	Regions map[string]Region `yaml:"regions"`
	// Classes maps each route class's name to how the class is enforced.
	//
	//   - Required
	//   - Key: class (e.g. write)
	//   - Rule: at least one and at most 256 (MaxClasses); names are 1-64
	//     bytes of letters, digits and . _ : @ -
	Classes map[string]Class `yaml:"classes"`
	// Tiers maps each tier's name to its limit for every class.
	//
	//   - Required
	//   - Key: tier (e.g. free)
	//   - Rule: at least one and at most 1024 (MaxTiers); names are 1-128
	//     bytes of letters, digits and . _ : @ -; each tier names every
	//     configured class and no other
	Tiers map[string]Tier `yaml:"tiers"`
	// Tenants maps tenant ids to what is particular about them: a tier
	// other than default_tier, limit overrides or shadow mode. In etcd
	// each tenant is a key of its own (see docs/operations.md, "Many
	// tenants"); in a file, write one entry per tenant under a top-level
	// "tenants:" line (block style), which is read in time linear in the
	// file.
	//
	//   - Default: none; tenants not listed get default_tier
	//   - Key: tenant (e.g. acme)
	//   - Rule: at most 2,000,000 (MaxTenants), at most 10,000 when not
	//     written in block style (MaxInlineTenants, e.g. one flow mapping
	//     "tenants: {a: ...}"); ids are 1-128 bytes of letters, digits and
	//     . _ : @ -
	Tenants map[string]Tenant `yaml:"tenants,omitempty"`
	// DefaultTier is the tier of tenants not listed under tenants.
	//
	//   - Required
	//   - Rule: must name a tier under tiers
	//   - Example: free
	DefaultTier string `yaml:"default_tier"`
	// Envoy maps Envoy rate-limit descriptors to quota keys: by entry
	// keys naming the tenant and class (descriptors), or by descriptor
	// trees in the shape of envoyproxy/ratelimit configs (domains).
	//
	//   - Default: no mappings: every descriptor Envoy sends is unmatched,
	//     answered OK and charged to no key
	Envoy Envoy `yaml:"envoy,omitempty"`
	// Auth maps client certificate identities to roles; read only when
	// the daemons serve mutual TLS.
	//
	//   - Default: no identities: with mutual TLS every call but health
	//     checks is refused
	Auth Auth `yaml:"auth,omitempty"`
}

// Region is one region's share of every key's global rate.
type Region struct {
	// Weight sets the region's static share of every key: rate × w_r / Σw
	// (and the burst split in whole multiples of the class's max_cost by
	// largest remainder), what the region gets without the global tier.
	// Set it to the region's usual share of traffic: keys whose demand
	// fits inside the static shares never reach the global tier.
	//
	//   - Required
	//   - Unit: relative weight (only ratios between regions matter)
	//   - Rule: a finite number > 0
	//   - Example: 2
	Weight float64 `yaml:"weight"`
	// MinShare is the fraction of a key's global rate the allocator keeps
	// for the region even without demand, at the cost of idling it
	// elsewhere. A drained region does not get it.
	//
	//   - Default: 0
	//   - Unit: fraction of a key's global rate
	//   - Rule: in [0, 1], at most max_share; the regions' min_shares sum
	//     to at most 1
	//   - Example: 0.1
	MinShare float64 `yaml:"min_share,omitempty"`
	// MaxShare caps the fraction of a key's global rate the region may be
	// granted, so one region cannot take everything.
	//
	//   - Default: 1 (no cap)
	//   - Unit: fraction of a key's global rate
	//   - Rule: in (0, 1], at least min_share and at least the region's
	//     weight share (weight / sum of weights: its static share, which a
	//     cap below would cut exactly when the region needs more); an
	//     explicit 0 is refused (leave it out for no cap)
	//   - Example: 0.8
	MaxShare float64 `yaml:"max_share,omitempty"`
	// Drained makes the region's static share of every key its floor (the
	// class's partition_share of what it would be); the other regions'
	// static shares do not change: capacity moves to them by grants as the
	// drained region's grants expire. Use it before taking a region down;
	// a restore raises the static share once every region adopted it.
	//
	//   - Default: false
	//   - Rule: at least one region must not be drained
	//   - Example: true
	Drained bool `yaml:"drained,omitempty"`
}

// MarshalYAML leaves out a MaxShare of 1, the value it gets when left out.
func (r Region) MarshalYAML() (any, error) {
	type plain Region // drops this method, so encoding does not recurse
	out := plain(r)
	if out.MaxShare == 1 {
		out.MaxShare = 0
	}
	return out, nil
}

// Class is how one route class is enforced.
type Class struct {
	// Mode is how the class is enforced.
	//
	//   - Default: lease
	//   - Example: strict
	Mode Mode `yaml:"mode,omitempty"`
	// OnFailure is what an instance does while the regional service is
	// unreachable.
	//
	//   - Default: local
	//   - Example: closed
	OnFailure OnFailure `yaml:"on_failure,omitempty"`
	// Reclaim is what happens to the unused tokens of an expired lease.
	//
	//   - Default: reported
	//   - Example: none
	Reclaim Reclaim `yaml:"reclaim,omitempty"`
	// Shadow makes every decision of the class an allow, reporting the real
	// verdict in Decision.WouldDeny (counted as shadow_denied; Envoy is
	// answered OK): for rolling out a new limit.
	//
	//   - Default: false
	//   - Example: true
	Shadow bool `yaml:"shadow,omitempty"`
	// MaxCost is the largest cost one request of the class is expected to
	// carry. Static bursts are split among regions in whole multiples of it
	// (largest remainder by weight), so a region that holds any of a key's
	// burst can admit such a request, and a region holding none obtains a
	// unit from the global tier when it has demand. It does not refuse
	// larger costs.
	//
	//   - Default: 1
	//   - Unit: tokens
	//   - Rule: a whole number in 1..1048576 (quota.MaxCost), at most every
	//     burst configured for the class
	//   - Example: 10
	MaxCost int64 `yaml:"max_cost,omitempty"`
	// PartitionShare is the fraction of its static share (rate and burst)
	// a region keeps for the class once its static lease has lapsed (or
	// while it is drained): its floor, which the global tier keeps
	// reserving for it. 1 is availability first (a partitioned region keeps
	// its whole static share and the global tier never re-divides it); 0
	// means a region cut off for longer than region_lease admits nothing
	// more of the class and its share goes to the others; a fraction in
	// between keeps some service there at the cost of that much capacity
	// everywhere else.
	//
	//   - Default: 1 for on_failure open, 0 for local and closed
	//   - Unit: fraction of the region's static share
	//   - Rule: in [0, 1]
	//   - Example: 0.25
	PartitionShare *float64 `yaml:"partition_share,omitempty"`
}

// PartitionFraction is the class's partition_share, or its default by
// on_failure when left out (1 for open, 0 otherwise).
func (c Class) PartitionFraction() float64 {
	if c.PartitionShare != nil {
		return *c.PartitionShare
	}
	if c.OnFailure == OnFailureOpen {
		return 1
	}
	return 0
}

// Unit is the class's MaxCost as the burst unit, 1 when left out.
func (c Class) Unit() float64 {
	if c.MaxCost <= 0 {
		return 1
	}
	return float64(c.MaxCost)
}

// Tier maps every configured class name to its limit.
//
//   - Key: class (e.g. write)
type Tier map[string]LimitSpec

// LimitSpec is the rate and burst of one key: a token bucket that holds
// up to burst tokens and refills at rate, shared by every region.
type LimitSpec struct {
	// Rate is the key's global refill rate, summed over every region.
	//
	//   - Required
	//   - Rule: > 0, at most 1e9/s (quota.MaxRate); slow enough rates are
	//     refused when the least-weighted region would take more than ten
	//     years to refill the burst at its static share
	//   - Example: 100/s
	Rate Rate `yaml:"rate"`
	// Burst is the most tokens the key's bucket holds, summed over every
	// region: what a tenant can spend at once after being idle.
	//
	//   - Required
	//   - Unit: tokens
	//   - Rule: a whole number in [1, 1e9] (quota.MaxBurst), at least the
	//     class's max_cost
	//   - Example: 200
	Burst float64 `yaml:"burst"`
}

// Tenant is one listed tenant.
type Tenant struct {
	// Tier names the tenant's tier.
	//
	//   - Required
	//   - Rule: must name a tier under tiers
	//   - Example: pro
	Tier string `yaml:"tier"`
	// Overrides replace the tier's limit for some classes.
	//
	//   - Default: none (every class has its tier's limit)
	//   - Key: class (e.g. write)
	//   - Rule: each class must be configured under classes
	Overrides map[string]LimitSpec `yaml:"overrides,omitempty"`
	// Shadow puts all of the tenant's traffic in shadow mode: every
	// decision is an allow, the real verdict is counted as shadow_denied.
	//
	//   - Default: false
	//   - Example: true
	Shadow bool `yaml:"shadow,omitempty"`
}

// Envoy configures the Envoy rate-limit service endpoint.
type Envoy struct {
	// Descriptors map Envoy descriptors to quota keys, tried in order; the
	// first that matches a descriptor decides it. A descriptor no mapping
	// matches goes to its domain's tree under domains, if any; else it is
	// answered OK and charged to no key.
	//
	//   - Default: none
	//   - Rule: no two equal
	Descriptors []EnvoyDescriptor `yaml:"descriptors,omitempty"`
	// Domains are descriptor trees, one per Envoy domain, in the shape of
	// envoyproxy/ratelimit config files: nested key/value nodes whose
	// leaves name a class (the limit), unlimited or shadow_mode (see
	// EnvoyNode for the matching rules). They decide the descriptors no
	// entry of descriptors matches.
	//
	//   - Default: none
	//   - Rule: each domain at most once
	Domains []EnvoyDomain `yaml:"domains,omitempty"`
}

// EnvoyDescriptor maps descriptors of one Envoy domain to (tenant, class).
type EnvoyDescriptor struct {
	// Domain is the Envoy rate-limit domain (the domain of the
	// envoy.filters.http.ratelimit filter).
	//
	//   - Required
	//   - Rule: no spaces or control characters
	//   - Example: sluice
	Domain string `yaml:"domain"`
	// TenantKey is the descriptor entry key whose value is the tenant id.
	//
	//   - Required
	//   - Rule: no spaces or control characters
	//   - Example: tenant
	TenantKey string `yaml:"tenant_key"`
	// ClassKey is the descriptor entry key whose value is the class.
	//
	//   - Default: none; then class must be set
	//   - Rule: exactly one of class_key and class is set; differs from
	//     tenant_key; no spaces or control characters
	//   - Example: class
	ClassKey string `yaml:"class_key,omitempty"`
	// Class is the fixed class of matching descriptors when class_key is
	// not set.
	//
	//   - Default: none; then class_key must be set
	//   - Rule: exactly one of class_key and class is set; must name a
	//     class under classes
	//   - Example: write
	Class string `yaml:"class,omitempty"`
}

//go:embed sample.yaml
var sampleYAML []byte

// Default returns a fresh copy of the built-in sample config, so daemons
// can run with no setup.
func Default() *Config {
	c, err := Parse(sampleYAML)
	if err != nil {
		// The sample is compiled in and covered by tests.
		panic(fmt.Sprintf("config: built-in sample is invalid: %v", err))
	}
	return c
}

// SampleYAML returns the built-in sample config as written, with comments.
func SampleYAML() []byte { return bytes.Clone(sampleYAML) }

// Parse reads one YAML document strictly (unknown fields are errors naming
// the field and line), applies defaults and validates. Every error wraps
// ErrInvalidConfig. It is ParseContext without a deadline.
func Parse(data []byte) (*Config, error) { return ParseContext(context.Background(), data) }

// ParseContext is Parse that stops when ctx is done (returning an error
// wrapping ctx's). Time and memory are linear in the document's size; a
// document over MaxConfigBytes, or over any other documented maximum, is
// refused with a *LimitError naming the limit.
func ParseContext(ctx context.Context, data []byte) (*Config, error) {
	if len(data) > MaxConfigBytes {
		return nil, &LimitError{Limit: "config.MaxConfigBytes", Max: MaxConfigBytes, Got: int64(len(data)), What: "bytes"}
	}
	block, found, split := findTenantBlock(data)
	var (
		tenants    map[string]Tenant
		tenantMsgs []string
	)
	if found && split {
		var err error
		tenants, tenantMsgs, split, err = readTenantBlock(ctx, data, block)
		if err != nil {
			return nil, err
		}
	}
	if !split {
		block.rest = data // read the document whole
	}
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(block.rest))
	if err := dec.Decode(&root); err != nil {
		if !errors.Is(err, io.EOF) {
			return nil, yamlProblems(err)
		}
		if !found {
			return nil, fmt.Errorf("%w: the document is empty", ErrInvalidConfig)
		}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: line %d: want exactly one YAML document", ErrInvalidConfig, extra.Line)
	}
	if !split {
		if n := countInlineTenants(&root); n > MaxInlineTenants {
			return nil, &LimitError{Limit: "config.MaxInlineTenants", Max: MaxInlineTenants, Got: int64(n),
				What: "tenants not written in block style (one entry per tenant under a top-level \"tenants:\" line)"}
		}
	}
	if err := canceled(ctx); err != nil {
		return nil, err
	}

	var c Config
	if root.Kind != 0 {
		strict := yaml.NewDecoder(bytes.NewReader(block.rest))
		strict.KnownFields(true)
		if err := strict.Decode(&c); err != nil {
			var te *yaml.TypeError
			if len(tenantMsgs) > 0 && errors.As(err, &te) {
				err = &yaml.TypeError{Errors: append(te.Errors, tenantMsgs...)}
			}
			return nil, yamlProblems(err)
		}
	}
	if len(tenantMsgs) > 0 {
		return nil, yamlProblems(&yaml.TypeError{Errors: tenantMsgs})
	}
	if split && len(tenants) > 0 {
		c.Tenants = tenants
	}
	// Zero means "left out" in Go for max_share, demand_alpha,
	// global_shards and max_cost, and a fraction decodes into a whole
	// number field truncated: both must be caught in the document, where
	// they can still be told apart.
	errs := explicitZeroMaxShares(&root)
	errs = append(errs, writtenNumberProblems(&root)...)
	c.ApplyDefaults()
	more, err := c.problemsContext(ctx)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(capProblems(append(errs, more...))...); err != nil {
		return nil, err
	}
	return &c, nil
}

// explicitZeroMaxShares finds regions.<name>.max_share set to zero.
func explicitZeroMaxShares(root *yaml.Node) []error {
	var errs []error
	doc := root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	regions := mappingValue(doc, "regions")
	if regions == nil || regions.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(regions.Content); i += 2 {
		name, region := regions.Content[i], regions.Content[i+1]
		share := mappingValue(region, "max_share")
		if share == nil || share.Kind != yaml.ScalarNode {
			continue
		}
		var v float64
		if share.Decode(&v) == nil && v == 0 {
			errs = append(errs, &FieldError{
				Path:    "regions." + name.Value + ".max_share",
				Message: fmt.Sprintf("must be in (0, 1], got 0 at line %d (leave it out for no cap)", share.Line),
			})
		}
	}
	return errs
}

// writtenNumberProblems finds numbers written where their Go form cannot
// tell them apart from a valid value: demand_alpha, global_shards or a
// class's max_cost written as 0 (which would become the default), and
// global_shards or max_cost written as a fraction (which would be
// truncated).
func writtenNumberProblems(root *yaml.Node) []error {
	doc := root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	var errs []error
	if v, line, ok := scalarNumber(mappingValue(doc, "demand_alpha")); ok && v == 0 {
		errs = append(errs, &FieldError{Path: "demand_alpha",
			Message: fmt.Sprintf("must be in (0, 1], got 0 at line %d (leave it out for the default 1)", line)})
	}
	whole := func(path string, n *yaml.Node, hi int64) {
		v, line, ok := scalarNumber(n)
		switch {
		case !ok:
		case v != math.Trunc(v):
			errs = append(errs, &FieldError{Path: path,
				Message: fmt.Sprintf("must be a whole number in 1..%d, got %s at line %d", hi, n.Value, line)})
		case v == 0:
			errs = append(errs, &FieldError{Path: path,
				Message: fmt.Sprintf("must be in 1..%d, got 0 at line %d (leave it out for the default 1)", hi, line)})
		}
	}
	whole("global_shards", mappingValue(doc, "global_shards"), shard.MaxShards)
	if classes := mappingValue(doc, "classes"); classes != nil && classes.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(classes.Content); i += 2 {
			name, class := classes.Content[i], classes.Content[i+1]
			whole("classes."+name.Value+".max_cost", mappingValue(class, "max_cost"), quota.MaxCost)
		}
	}
	return errs
}

// scalarNumber is the number a scalar node holds and its line; ok is
// false for anything else (left to the decoder to report).
func scalarNumber(n *yaml.Node) (v float64, line int, ok bool) {
	if n == nil || n.Kind != yaml.ScalarNode {
		return 0, 0, false
	}
	if n.Decode(&v) != nil {
		return 0, 0, false
	}
	return v, n.Line, true
}

func mappingValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// ApplyDefaults fills every optional field left at its zero value. Parse
// calls it; code that builds a Config by hand calls it before Validate.
func (c *Config) ApplyDefaults() {
	if c.Epoch == 0 {
		c.Epoch = Duration(DefaultEpoch)
	}
	if c.DemandAlpha == 0 {
		c.DemandAlpha = 1
	}
	if c.GrantValidity == 0 {
		c.GrantValidity = DefaultGrantValidityEpochs * c.Epoch
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = Duration(DefaultLeaseTTL)
	}
	if c.Refresh == 0 {
		c.Refresh = Duration(DefaultRefresh)
	}
	if c.RegionLease == 0 {
		c.RegionLease = max(Duration(DefaultRegionLease), 2*c.GrantValidity)
	}
	for name, r := range c.Regions {
		if r.MaxShare == 0 {
			r.MaxShare = 1
			c.Regions[name] = r
		}
	}
	for name, cl := range c.Classes {
		if cl.Mode == "" {
			cl.Mode = ModeLease
		}
		if cl.OnFailure == "" {
			cl.OnFailure = OnFailureLocal
		}
		if cl.Reclaim == "" {
			cl.Reclaim = ReclaimReported
		}
		c.Classes[name] = cl
	}
}

// Marshal writes the config as YAML: deterministic (map keys sorted), with
// every rate in its shortest exact form, so Parse(Marshal(c)) equals c for
// a config that passed Parse.
func (c *Config) Marshal() ([]byte, error) {
	var buf bytes.Buffer
	if err := c.WriteYAML(&buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// ShardMap is the global tier's shard map under c: global_shards ranges of
// the key hash space (one when left out or invalid; Validate refuses an
// invalid count).
func (c *Config) ShardMap() shard.Map {
	m, err := shard.New(int(c.GlobalShards))
	if c.GlobalShards == 0 || err != nil {
		return shard.Map{}
	}
	return m
}
