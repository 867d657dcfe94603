package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/pkg/quota"
)

// ErrClosed is returned by every operation on a closed Client or Table.
var ErrClosed = errors.New("lease: closed")

// Mode says how a class is limited.
type Mode uint8

const (
	// ModeLease decides from locally held leases (the default).
	ModeLease Mode = iota
	// ModeStrict asks the region for every request (Check RPC).
	ModeStrict
)

func (m Mode) String() string {
	if m == ModeStrict {
		return "strict"
	}
	return "lease"
}

// ParseMode parses the wire/config spelling ("lease", "strict").
func ParseMode(s string) (Mode, error) {
	switch s {
	case "lease":
		return ModeLease, nil
	case "strict":
		return ModeStrict, nil
	}
	return 0, fmt.Errorf("%w: mode %q is not lease or strict", quota.ErrInvalid, s)
}

// Policy is a class's on_failure policy: what an instance decides while the
// regional service cannot be reached and it holds no usable tokens.
type Policy uint8

const (
	// PolicyLocal limits locally at this instance's share of the region's
	// rate (region rate ÷ live instances, burst likewise), the default.
	PolicyLocal Policy = iota
	// PolicyOpen admits everything.
	PolicyOpen
	// PolicyClosed denies everything.
	PolicyClosed
)

func (p Policy) String() string {
	switch p {
	case PolicyOpen:
		return "open"
	case PolicyClosed:
		return "closed"
	}
	return "local"
}

// ParsePolicy parses the wire/config spelling ("local", "open", "closed").
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "local":
		return PolicyLocal, nil
	case "open":
		return PolicyOpen, nil
	case "closed":
		return PolicyClosed, nil
	}
	return 0, fmt.Errorf("%w: on_failure %q is not local, open or closed", quota.ErrInvalid, s)
}

// ClassPolicy is what an instance knows about a class from its own
// config. As TableOptions.Classes, it holds before the region told the
// instance anything about a key, and the region's answers override it per
// key; as an answer of TableOptions.Policies, its OnFailure and Shadow
// decide every degraded decision of the class (see Table.Fallback).
type ClassPolicy struct {
	Mode      Mode
	OnFailure Policy
	// Shadow admits what the class's limit would deny, counting it as
	// shadow_denied.
	Shadow bool
}

// Action tells the caller of Table.Allow what to do next.
type Action uint8

const (
	// ActNone: the decision is final.
	ActNone Action = iota
	// ActRefill: the decision is final, and the key's pool just crossed its
	// low-water mark: start a background refill (PrepareRefill).
	ActRefill
	// ActAcquire: no decision yet. The key has no usable tokens: acquire
	// synchronously (PrepareAcquire, then Apply and Allow again), or, when
	// the region cannot be reached, decide with Fallback.
	ActAcquire
	// ActCheck: no decision yet. The key's class is strict: ask the region
	// (Check RPC, then ApplyCheck), or decide with Fallback.
	ActCheck
)

func (a Action) String() string {
	switch a {
	case ActRefill:
		return "refill"
	case ActAcquire:
		return "acquire"
	case ActCheck:
		return "check"
	}
	return "none"
}

// Result classifies a decision for metrics.
type Result uint8

const (
	ResultAllowed Result = iota
	ResultDenied
	// ResultShadowDenied: admitted because the class is in shadow mode, but
	// the limiter would have denied it.
	ResultShadowDenied
	numResults
)

func (r Result) String() string {
	switch r {
	case ResultDenied:
		return "denied"
	case ResultShadowDenied:
		return "shadow_denied"
	}
	return "allowed"
}

// TableOptions configures a Table.
type TableOptions struct {
	// Refresh is the period of the instance's Sync (required, > 0). Batches
	// are sized to last 1.5 refresh intervals at the key's recent demand.
	Refresh time.Duration
	// IdleTimeout is how long a key may see no demand before the instance
	// forgets it and releases its lease (optional, default 10 × Refresh).
	IdleTimeout time.Duration
	// Classes gives the mode and on_failure policy of classes before the
	// region has answered for a key (optional; unknown classes are
	// lease/local).
	Classes map[string]ClassPolicy
	// Policies is the live config's policy of a class (optional): the
	// config the process holds now, reloaded or not, false for a class it
	// does not name. When it names the class, its OnFailure and Shadow
	// decide each degraded decision of the class's keys (Fallback), over
	// what the region last said of the key and over Classes, from the
	// next decision on, keys already degraded included: a policy changed
	// during an outage, when no answer of the region can carry it,
	// applies at once. Without it (or for a class it does not name) the
	// region's last answer for the key decides, else Classes, else
	// local. It is called on every degraded decision, with no lock of
	// the Table held; it must be cheap and must not call the Table.
	Policies func(class string) (ClassPolicy, bool)
	// StaticShare is what the live config gives a key in this instance's
	// region (optional): the region's static share of the key's limit,
	// rate·w_r/Σw and the burst's share in whole units
	// (config.Config.StaticShareOf), false for a key the config does not
	// resolve or while there is none. The local on_failure policy of a
	// key the region never described runs at the lower of it and
	// FallbackLimit (rate and burst each, the burst at least 1), rather
	// than at FallbackLimit whatever the key's limit. It is called only on
	// degraded decisions of such keys under the local policy, with no
	// lock of the Table held; it must not call the Table.
	StaticShare func(key quota.Key) (quota.Limit, bool)
	// Tier names a key's tier before the region has (optional; the
	// caller's config, as the region resolves it): the decisions made
	// meanwhile, the on_failure policy's while the region is out of reach
	// among them, are counted under it rather than "unknown". "" leaves
	// the tier unknown. It is called while the decision totals are locked,
	// so it must not call the Table.
	Tier func(key quota.Key) string
	// FallbackLimit is the local limit (tokens/s, tokens) of the local
	// on_failure policy for a key the region never described (optional,
	// default 10/s with burst 10), or its bound where StaticShare names
	// the key.
	FallbackLimit quota.Limit
	// SeqBase: the first report carries SeqBase+1 (optional, default 0).
	// Report seqs come from one counter for the whole table, so they rise
	// per key across forgetting and re-creating the key. A process that
	// reuses an instance id after a restart must start above its previous
	// life's seqs; the Client uses the wall clock in microseconds. The
	// region refuses seqs above 2^53.
	SeqBase uint64
	// MaxReportsPerSync caps the reports in one Sync batch (optional,
	// default 500); more keys are split over several RPCs.
	MaxReportsPerSync int
	// OrderedScans makes the table visit its keys in key order (tenant,
	// then class) wherever it walks them all: which keys share a Sync
	// batch, and which make an early batch cut at MaxReportsPerSync,
	// then follow from the keys alone, not from the random order of a Go
	// map. For reproducible runs (the simulator); it costs a sort of the
	// keys per walk, so a daemon leaves it off (optional, default false).
	OrderedScans bool
}

const (
	defaultMaxReportsPerSync = 500
	defaultFallbackRate      = 10
	defaultFallbackBurst     = 10
)

func (o TableOptions) withDefaults() (TableOptions, error) {
	if o.Refresh <= 0 {
		return o, fmt.Errorf("%w: lease table Refresh %v must be positive", quota.ErrInvalid, o.Refresh)
	}
	if o.IdleTimeout < 0 {
		return o, fmt.Errorf("%w: lease table IdleTimeout %v is negative", quota.ErrInvalid, o.IdleTimeout)
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 10 * o.Refresh
	}
	if o.MaxReportsPerSync < 0 {
		return o, fmt.Errorf("%w: lease table MaxReportsPerSync %d is negative", quota.ErrInvalid, o.MaxReportsPerSync)
	}
	if o.MaxReportsPerSync == 0 {
		o.MaxReportsPerSync = defaultMaxReportsPerSync
	}
	switch {
	case o.FallbackLimit == quota.Limit{}:
		o.FallbackLimit = quota.Limit{Rate: defaultFallbackRate, Burst: defaultFallbackBurst}
	case !(o.FallbackLimit.Rate > 0) || o.FallbackLimit.Burst < 1:
		return o, fmt.Errorf("%w: lease table FallbackLimit %+v needs Rate > 0 and Burst >= 1", quota.ErrInvalid, o.FallbackLimit)
	}
	for class, p := range o.Classes {
		if err := (quota.Key{Tenant: "x", Class: class}).Validate(); err != nil {
			return o, fmt.Errorf("lease table Classes: %w", err)
		}
		if p.Mode > ModeStrict || p.OnFailure > PolicyClosed {
			return o, fmt.Errorf("%w: lease table Classes[%q] has an unknown mode or policy", quota.ErrInvalid, class)
		}
	}
	return o, nil
}
