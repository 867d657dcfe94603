package scale

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/sim/scenario"
)

// ErrInvalid marks a bad scale scenario.
var ErrInvalid = errors.New("invalid scale scenario")

//go:embed scenarios/*.yaml
var files embed.FS

// Spec is a scale scenario: a key population described by its size and
// shape rather than listed, a topology by counts, and timed faults.
type Spec struct {
	// Kind is "scale": it tells a scale scenario file from a per-request
	// one (sim/scenario).
	Kind        string `yaml:"kind"`
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Duration is the simulated time; Day the length of one diurnal cycle
	// (a compressed day; at most Duration, so every region sees its peak).
	Duration config.Duration `yaml:"duration"`
	Day      config.Duration `yaml:"day"`
	// Warmup is left out of utilization.
	Warmup config.Duration `yaml:"warmup"`
	Seed   uint64          `yaml:"seed"`
	// Keys is the number of quota keys; Contended the fraction of them
	// whose demand in some region exceeds its static share at some time
	// of the day.
	Keys      int     `yaml:"keys"`
	Contended float64 `yaml:"contended"`
	Regions   int     `yaml:"regions"`
	Instances int     `yaml:"instances"`
	Shards    int     `yaml:"shards"`
	// Zipf is the index of the Pareto tail of how hard keys push against
	// their limits (1: Zipf-like; larger: a thinner tail).
	Zipf float64 `yaml:"zipf"`
	// DiurnalLow is the trough of each region's day curve as a fraction of
	// its peak.
	DiurnalLow float64 `yaml:"diurnal_low"`
	// RTT is the round trip between a region leader and a global shard.
	RTT config.Duration `yaml:"rtt"`
	// SessionTTL is how long an election takes to replace a lost leader.
	SessionTTL config.Duration `yaml:"session_ttl"`
	// Sample, when above 1, models one in Sample of the keys that come
	// near the global tier (chosen by a hash of the key) and scales
	// their per-key costs (keys, bytes, script calls) by Sample; every
	// modeled key is still checked exactly. 0 or 1: every such key.
	Sample int     `yaml:"sample"`
	Faults []Fault `yaml:"faults"`
}

// Fault is a timed fault: a region leader or a global shard leader lost
// at At; its successor is elected after the spec's SessionTTL.
type Fault struct {
	At     config.Duration `yaml:"at"`
	Kind   string          `yaml:"kind"`   // region-leader-loss | shard-leader-loss
	Region int             `yaml:"region"` // region index (region-leader-loss)
	Shard  int             `yaml:"shard"`  // shard index (shard-leader-loss)
}

// Fault kinds.
const (
	RegionLeaderLoss = "region-leader-loss"
	ShardLeaderLoss  = "shard-leader-loss"
)

// Names lists the shipped scale scenarios.
func Names() []string {
	entries, _ := fs.Glob(files, "scenarios/*.yaml")
	var out []string
	for _, e := range entries {
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(e, "scenarios/"), ".yaml"))
	}
	sort.Strings(out)
	return out
}

// Shipped reports whether name is a shipped scale scenario.
func Shipped(name string) bool {
	_, err := files.ReadFile("scenarios/" + name + ".yaml")
	return err == nil
}

// IsScaleFile reports whether the YAML file at path is a scale scenario
// (its kind is "scale"). Unreadable files are not.
func IsScaleFile(path string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var head struct {
		Kind string `yaml:"kind"`
	}
	return yaml.Unmarshal(data, &head) == nil && head.Kind == "scale"
}

// Load reads a shipped scale scenario by name, or a file by path.
func Load(name string) (*Spec, error) {
	data, err := files.ReadFile("scenarios/" + name + ".yaml")
	if err != nil {
		data, err = os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("%w: %s is neither a shipped scale scenario (%s) nor a readable file", ErrInvalid, name, strings.Join(Names(), ", "))
		}
	}
	return Parse(data)
}

// Parse decodes and validates a scale scenario; each bad field is named
// with its line ("keys 10 must be in 100..100000000 (line 4)").
func Parse(data []byte) (*Spec, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var s Spec
	if err := dec.Decode(&s); err != nil {
		var out []error
		for _, m := range config.YAMLMessages(err) {
			out = append(out, fmt.Errorf("%w: %s", ErrInvalid, m))
		}
		return nil, errors.Join(out...)
	}
	if bad := s.problems(); len(bad) > 0 {
		lineOf := scenario.LineOf(data)
		errs := make([]error, len(bad))
		for i, p := range bad {
			if l := lineOf(p.path); l > 0 {
				p.msg += fmt.Sprintf(" (line %d)", l)
			}
			errs[i] = fmt.Errorf("%w: %s", ErrInvalid, p.msg)
		}
		return nil, errors.Join(errs...)
	}
	return &s, nil
}

// Validate names every bad field.
func (s *Spec) Validate() error {
	var errs []error
	for _, p := range s.problems() {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalid, p.msg))
	}
	return errors.Join(errs...)
}

// problem is one bad field: its path ("faults[0].at"), which Parse finds
// the line of, and the message, which begins with it.
type problem struct{ path, msg string }

// problems are the spec's bad fields, in the order of its fields.
func (s *Spec) problems() []problem {
	var out []problem
	bad := func(path, format string, a ...any) {
		out = append(out, problem{path, fmt.Sprintf(format, a...)})
	}
	if s.Kind != "scale" {
		bad("kind", "kind %q must be scale", s.Kind)
	}
	if s.Name == "" {
		bad("name", "name is missing")
	}
	if time.Duration(s.Duration) < 10*time.Second {
		bad("duration", "duration %v must be at least 10s", time.Duration(s.Duration))
	}
	if d := time.Duration(s.Day); d <= 0 || d > time.Duration(s.Duration) {
		bad("day", "day %v must be in (0, duration]", d)
	}
	if w := time.Duration(s.Warmup); w < 0 || w >= time.Duration(s.Duration) {
		bad("warmup", "warmup %v must be in [0, duration)", w)
	}
	if s.Keys < 100 || s.Keys > 100_000_000 {
		bad("keys", "keys %d must be in 100..100000000", s.Keys)
	}
	if !(s.Contended > 0 && s.Contended <= 0.1) {
		bad("contended", "contended %v must be in (0, 0.1]", s.Contended)
	}
	regionsOK := s.Regions >= 2 && s.Regions <= 64
	if !regionsOK {
		bad("regions", "regions %d must be in 2..64", s.Regions)
	} else if s.Instances < s.Regions {
		bad("instances", "instances %d must be at least one per region (%d)", s.Instances, s.Regions)
	}
	shardsOK := s.Shards >= 1 && s.Shards <= 256
	if !shardsOK {
		bad("shards", "shards %d must be in 1..256", s.Shards)
	}
	if !(s.Zipf > 0 && s.Zipf <= 3) {
		bad("zipf", "zipf %v must be in (0, 3]", s.Zipf)
	}
	if !(s.DiurnalLow > 0 && s.DiurnalLow <= 1) {
		bad("diurnal_low", "diurnal_low %v must be in (0, 1]", s.DiurnalLow)
	}
	if r := time.Duration(s.RTT); r <= 0 || r >= 500*time.Millisecond {
		bad("rtt", "rtt %v must be in (0, 500ms)", r)
	}
	if t := time.Duration(s.SessionTTL); t <= 0 || t > time.Minute {
		bad("session_ttl", "session_ttl %v must be in (0, 1m]", t)
	}
	if s.Sample < 0 || s.Sample > 1000 {
		bad("sample", "sample %d must be in 0..1000", s.Sample)
	}
	// A fault's region or shard is judged only against a valid count:
	// "must be in 0..-1" would repeat the count's problem.
	for i, f := range s.Faults {
		if f.At < 0 || f.At >= s.Duration {
			bad(fmt.Sprintf("faults[%d].at", i), "faults[%d].at %v must be in [0, duration)", i, time.Duration(f.At))
		}
		switch f.Kind {
		case RegionLeaderLoss:
			if regionsOK && (f.Region < 0 || f.Region >= s.Regions) {
				bad(fmt.Sprintf("faults[%d].region", i), "faults[%d].region %d must be in 0..%d", i, f.Region, s.Regions-1)
			}
		case ShardLeaderLoss:
			if shardsOK && (f.Shard < 0 || f.Shard >= s.Shards) {
				bad(fmt.Sprintf("faults[%d].shard", i), "faults[%d].shard %d must be in 0..%d", i, f.Shard, s.Shards-1)
			}
		default:
			bad(fmt.Sprintf("faults[%d].kind", i), "faults[%d].kind %q must be %s or %s", i, f.Kind, RegionLeaderLoss, ShardLeaderLoss)
		}
	}
	return out
}
