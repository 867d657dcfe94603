package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"time"

	"go.yaml.in/yaml/v3"
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
type Config struct {
	// Epoch is the global allocation period P. Optional, default 1s,
	// at least 10ms.
	Epoch Duration `yaml:"epoch,omitempty"`
	// GrantValidity is how long a region grant stays valid (V). Optional,
	// default 5 × Epoch, at least 4 × Epoch.
	GrantValidity Duration `yaml:"grant_validity,omitempty"`
	// DemandAlpha is the weight of the newest epoch in the global tier's
	// moving average of each region's demand. Optional, default 1: follow
	// demand within an epoch, so capacity moves a few epochs after a shift;
	// lower values in (0, 1) smooth noisy demand and move capacity slower.
	DemandAlpha float64 `yaml:"demand_alpha,omitempty"`
	// LeaseTTL is how long an instance lease lives. Optional, default 5s.
	LeaseTTL Duration `yaml:"lease_ttl,omitempty"`
	// Refresh is the instance Sync period. Optional, default 1s; must be
	// below LeaseTTL/2 so one lost Sync never lets a lease lapse.
	Refresh Duration `yaml:"refresh,omitempty"`
	// RegionLease is how long a region may run on its static shares after
	// its last answered report (the global tier confers this static lease
	// in every answer). Past it the region runs on its floor (each class's
	// partition_share of its static share), and the global tier, once it
	// has not heard the region for RegionLease + GrantValidity + a clock
	// margin, reserves only that floor and re-divides the rest. Optional,
	// default 1m (or 2 × GrantValidity when that is longer); at least
	// 2 × GrantValidity and at most MaxRegionLease.
	RegionLease Duration `yaml:"region_lease,omitempty"`
	// Regions by name. Required, at least one.
	Regions map[string]Region `yaml:"regions"`
	// Classes by name. Required, at least one.
	Classes map[string]Class `yaml:"classes"`
	// Tiers by name. Required, at least one; each sets a limit for every class.
	Tiers map[string]Tier `yaml:"tiers"`
	// Tenants by id. Optional; tenants not listed get DefaultTier.
	Tenants map[string]Tenant `yaml:"tenants,omitempty"`
	// DefaultTier is the tier of unlisted tenants. Required; must name a tier.
	DefaultTier string `yaml:"default_tier"`
	// Envoy maps Envoy rate-limit descriptors to quota keys. Optional.
	Envoy Envoy `yaml:"envoy,omitempty"`
}

// Region is one region's share of every key's global rate.
type Region struct {
	// Weight sets the static share w_r / Σw. Required, > 0.
	Weight float64 `yaml:"weight"`
	// MinShare is the fraction of a key's global rate the allocator keeps
	// for the region even without demand. Optional, default 0, in [0, 1];
	// the regions' MinShares sum to at most 1.
	MinShare float64 `yaml:"min_share,omitempty"`
	// MaxShare caps the fraction of a key's global rate the region may be
	// granted. Optional, in (0, 1]; 0 (left out) means 1.
	MaxShare float64 `yaml:"max_share,omitempty"`
	// Drained makes the region's static share of every key its floor (the
	// class's partition_share of what it would be); the other regions'
	// static shares do not change: capacity moves to them by grants.
	// Optional, default false; at least one region must not be drained.
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
	// Mode is lease or strict. Optional, default lease.
	Mode Mode `yaml:"mode,omitempty"`
	// OnFailure is local, open or closed. Optional, default local.
	OnFailure OnFailure `yaml:"on_failure,omitempty"`
	// Reclaim is reported or none. Optional, default reported.
	Reclaim Reclaim `yaml:"reclaim,omitempty"`
	// Shadow makes every decision of the class an allow, reporting the real
	// verdict in Decision.WouldDeny. Optional, default false.
	Shadow bool `yaml:"shadow,omitempty"`
	// MaxCost is the largest cost one request of the class is expected to
	// carry. Static bursts are split among regions in whole multiples of it
	// (largest remainder by weight), so a region that holds any of a key's
	// burst can admit such a request, and a region holding none obtains a
	// unit from the global tier when it has demand. It does not refuse
	// larger costs. Optional, default 1; in 1..quota.MaxCost and at most
	// every burst configured for the class.
	MaxCost int64 `yaml:"max_cost,omitempty"`
	// PartitionShare is the fraction of its static share (rate and burst)
	// a region keeps for the class once its static lease has lapsed (or
	// while it is drained): its floor, which the global tier keeps
	// reserving for it. Optional, in [0, 1]; left out it is 1 for
	// on_failure open (availability first: a partitioned region keeps its
	// whole static share and the global tier never re-divides it) and 0
	// for local and closed (a region cut off for longer than region_lease
	// admits nothing more of the class, and its share goes to the others).
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
type Tier map[string]LimitSpec

// LimitSpec is the rate and burst of one key.
type LimitSpec struct {
	// Rate in tokens per second. Required, > 0.
	Rate Rate `yaml:"rate"`
	// Burst in tokens. Required, a whole number >= 1.
	Burst float64 `yaml:"burst"`
}

// Tenant is one listed tenant.
type Tenant struct {
	// Tier names the tenant's tier. Required; must exist.
	Tier string `yaml:"tier"`
	// Overrides replace the tier's limit for some classes. Optional; each
	// class must exist.
	Overrides map[string]LimitSpec `yaml:"overrides,omitempty"`
	// Shadow puts all of the tenant's traffic in shadow mode. Optional.
	Shadow bool `yaml:"shadow,omitempty"`
}

// Envoy configures the Envoy rate-limit service endpoint.
type Envoy struct {
	// Descriptors, tried in order. Optional.
	Descriptors []EnvoyDescriptor `yaml:"descriptors,omitempty"`
}

// EnvoyDescriptor maps descriptors of one Envoy domain to (tenant, class).
type EnvoyDescriptor struct {
	// Domain is the Envoy rate-limit domain. Required.
	Domain string `yaml:"domain"`
	// TenantKey is the descriptor entry key whose value is the tenant id.
	// Required.
	TenantKey string `yaml:"tenant_key"`
	// ClassKey is the descriptor entry key whose value is the class.
	// Exactly one of ClassKey and Class is set.
	ClassKey string `yaml:"class_key,omitempty"`
	// Class is the fixed class of matching descriptors when ClassKey is
	// empty; it must exist.
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
// ErrInvalidConfig.
func Parse(data []byte) (*Config, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: the document is empty", ErrInvalidConfig)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: line %d: want exactly one YAML document", ErrInvalidConfig, extra.Line)
	}

	var c Config
	strict := yaml.NewDecoder(bytes.NewReader(data))
	strict.KnownFields(true)
	if err := strict.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	// Zero MaxShare means "left out" in Go, so an explicit zero must be
	// caught in the document, where it can still be told apart.
	errs := explicitZeroMaxShares(&root)
	c.ApplyDefaults()
	if err := errors.Join(append(errs, c.problems()...)...); err != nil {
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
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return nil, fmt.Errorf("config: encode YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: encode YAML: %w", err)
	}
	return buf.Bytes(), nil
}
