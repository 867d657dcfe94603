package config

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Rate is a refill rate in tokens per second. In YAML it is written with a
// unit, "10/s", "6/m", "1000/h" or "5/d", or as a bare number meaning per
// second, and it is written back in the shortest form that parses to the same
// float64 exactly.
type Rate float64

// rateUnit is one accepted rate unit.
type rateUnit struct {
	suffix  string
	seconds float64
}

// rateUnits are the accepted units, in the order ties are broken when
// choosing how to write a rate.
func rateUnits() [4]rateUnit { return [4]rateUnit{{"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}} }

// ParseRate parses "10/s", "6/m", "1000/h", "5/d", "2.5/s" or "7" (per
// second).
// The sign is accepted so that Validate can report a non-positive rate with
// its field path; infinities, NaN, hex and other number forms are refused.
func ParseRate(s string) (Rate, error) {
	num, unit, hasUnit := strings.Cut(s, "/")
	seconds := 1.0
	if hasUnit {
		found := false
		for _, u := range rateUnits() {
			if unit == u.suffix {
				seconds, found = u.seconds, true
				break
			}
		}
		if !found {
			return 0, fmt.Errorf("rate %q has unit %q; use /s, /m, /h or /d", s, unit)
		}
	}
	if num == "" || strings.Trim(num, "0123456789.eE+-") != "" {
		return 0, fmt.Errorf("rate %q is not a number optionally followed by /s, /m, /h or /d", s)
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsInf(n, 0) || math.IsNaN(n) {
		return 0, fmt.Errorf("rate %q is not a finite number optionally followed by /s, /m, /h or /d", s)
	}
	return Rate(n / seconds), nil
}

// String writes the rate in its shortest exact form, e.g. "6/m" for 0.1.
func (r Rate) String() string {
	v := float64(r)
	if math.IsInf(v, 0) || math.IsNaN(v) {
		return strconv.FormatFloat(v, 'g', -1, 64) + "/s"
	}
	best := ""
	for _, u := range rateUnits() {
		perUnit := v * u.seconds
		for prec := 1; prec <= 17; prec++ {
			n, err := strconv.ParseFloat(strconv.FormatFloat(perUnit, 'g', prec, 64), 64)
			if err != nil || n/u.seconds != v {
				continue
			}
			candidate := strconv.FormatFloat(n, 'f', -1, 64) + "/" + u.suffix
			if best == "" || len(candidate) < len(best) {
				best = candidate
			}
			break
		}
	}
	if best == "" {
		// Not reachable for finite values (17 digits per second are always
		// exact); kept so String never returns an empty rate.
		best = strconv.FormatFloat(v, 'g', -1, 64) + "/s"
	}
	return best
}

// UnmarshalYAML reads a rate scalar. Errors are type errors naming the line,
// so decoding goes on and reports every bad value at once.
func (r *Rate) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return typeError(n, "a rate must be a scalar like 10/s, got a %s", kindName(n.Kind))
	}
	v, err := ParseRate(n.Value)
	if err != nil {
		return typeError(n, "%v", err)
	}
	*r = v
	return nil
}

// MarshalYAML writes the rate in its shortest exact form.
func (r Rate) MarshalYAML() (any, error) {
	if math.IsInf(float64(r), 0) || math.IsNaN(float64(r)) {
		return nil, fmt.Errorf("rate %v is not finite", float64(r))
	}
	return r.String(), nil
}

// Duration is a time.Duration written as "1s" or "250ms" in YAML.
type Duration time.Duration

// String is time.Duration's form ("1s", "250ms").
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML reads a duration. A zero or negative duration is refused
// here, with its line: in Go a zero Duration means "use the default", so an
// explicit "0s" would otherwise be silently replaced.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return typeError(n, "a duration must be a scalar like 1s or 250ms, got a %s", kindName(n.Kind))
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		if DurationSyntax(n.Value) {
			return typeError(n, "duration %q is out of range (at most %v)", n.Value, time.Duration(math.MaxInt64))
		}
		return typeError(n, "duration %q: want a number with a unit, like 1s or 250ms", n.Value)
	}
	if v <= 0 {
		return typeError(n, "duration %q must be positive (an optional field left out takes its default)", n.Value)
	}
	*d = Duration(v)
	return nil
}

// DurationSyntax reports whether s is written as time.ParseDuration reads
// a duration: such a value that ParseDuration refuses is out of
// time.Duration's range, not malformed.
func DurationSyntax(s string) bool { return durationForm.MatchString(s) }

var durationForm = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+$`)

// MarshalYAML writes time.Duration's form.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

func typeError(n *yaml.Node, format string, args ...any) error {
	return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %s", n.Line, fmt.Sprintf(format, args...))}}
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "sequence"
	case yaml.AliasNode:
		return "alias"
	case yaml.DocumentNode:
		return "document"
	}
	return "scalar"
}

// Mode is how a class is enforced.
type Mode string

const (
	// ModeLease lets instances decide from leased tokens in memory.
	ModeLease Mode = "lease"
	// ModeStrict checks every request against the regional Redis.
	ModeStrict Mode = "strict"
)

// OnFailure is what an instance does when the regional service is
// unreachable.
type OnFailure string

const (
	// OnFailureLocal limits locally at the region rate divided by live instances.
	OnFailureLocal OnFailure = "local"
	// OnFailureOpen admits everything.
	OnFailureOpen OnFailure = "open"
	// OnFailureClosed denies everything.
	OnFailureClosed OnFailure = "closed"
)

// Reclaim is what happens to the unused tokens of an expired lease.
type Reclaim string

const (
	// ReclaimReported returns granted minus last reported use to the bucket.
	ReclaimReported Reclaim = "reported"
	// ReclaimNone forfeits them.
	ReclaimNone Reclaim = "none"
)
