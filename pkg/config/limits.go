package config

import (
	"context"
	"fmt"
)

// Documented maxima of a config (docs/operations.md, "Config limits").
// Whatever exceeds one is refused with an error naming the limit, before
// the work it would cause: the size before any parsing, the tenant count
// while tenants are read.
const (
	// MaxConfigBytes is the largest config document Parse accepts (a file
	// given to sluicectl validate or apply). A document in one etcd key is
	// bounded far lower by etcd's request limit (see package configstore).
	MaxConfigBytes = 128 << 20
	// MaxTenants is the most tenants one config lists.
	MaxTenants = 2_000_000
	// MaxRegions is the most regions: every static share and every report
	// touches each of them.
	MaxRegions = 64
	// MaxClasses is the most route classes.
	MaxClasses = 256
	// MaxTiers is the most tiers.
	MaxTiers = 1024
	// MaxInlineTenants is the most tenants written other than in block
	// style (one "name: ..." entry per line at one indentation under a
	// top-level "tenants:" line), for example as one flow mapping
	// "tenants: {a: ..., b: ...}": such a mapping is read whole, which
	// costs far more per tenant.
	MaxInlineTenants = 10_000
	// MaxProblems is the most problems one error lists; the rest are
	// counted in a last line.
	MaxProblems = 1000
)

// LimitError is a config that exceeds one of the documented maxima. It
// wraps ErrInvalidConfig.
type LimitError struct {
	// Limit names the limit, like "config.MaxTenants".
	Limit string
	// Max is the limit's value, Got what was found (0 when counting stopped
	// at the limit).
	Max, Got int64
	// What says what was counted, like "tenants".
	What string
}

func (e *LimitError) Error() string {
	if e.Got > 0 {
		return fmt.Sprintf("%s: %d %s is more than the limit of %d", e.Limit, e.Got, e.What, e.Max)
	}
	return fmt.Sprintf("%s: more than the limit of %d %s", e.Limit, e.Max, e.What)
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *LimitError) Unwrap() error { return ErrInvalidConfig }

// ctxCheckEvery is how many tenants are handled between two looks at the
// context, so that cancellation is noticed within milliseconds.
const ctxCheckEvery = 1024

// canceled is ctx's error when it is done, wrapped so callers see why the
// work stopped.
func canceled(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("config: stopped: %w", err)
	}
	return nil
}

// capProblems keeps the first MaxProblems problems and counts the rest in
// a last *MoreProblems.
func capProblems(errs []error) []error {
	if len(errs) <= MaxProblems {
		return errs
	}
	return append(errs[:MaxProblems:MaxProblems], &MoreProblems{N: len(errs) - MaxProblems})
}

// MoreProblems ends a list of problems cut at MaxProblems: N more were
// found and not listed. It wraps ErrInvalidConfig.
type MoreProblems struct {
	// N is how many problems were left out.
	N int
}

func (e *MoreProblems) Error() string {
	return fmt.Sprintf("config: and %d more problems not listed (config.MaxProblems is %d)", e.N, MaxProblems)
}

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *MoreProblems) Unwrap() error { return ErrInvalidConfig }
