package scenario

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// Defaults.
const (
	DefaultWarmup         = 20 * time.Second
	DefaultSessionTTL     = 5 * time.Second
	DefaultLocalLatency   = 500 * time.Microsecond
	DefaultRegionLatency  = 50 * time.Millisecond
	DefaultJitter         = 0.1
	DefaultLow            = 0.1
	DefaultAlpha          = 1.2
	DefaultSigma          = 1.0
	DefaultConvergenceTol = 0.05
	DefaultChaosMinFor    = 10 * time.Second
	DefaultChaosMaxFor    = 60 * time.Second
	DefaultChaosRestart   = 20 * time.Second
	DefaultGlobalRestart  = time.Minute
	// MinDiurnalPeriod is the shortest diurnal period: a shorter cycle
	// turns over faster than the limiter's epochs, and is played as
	// noise (1ns had no effect at all).
	MinDiurnalPeriod = time.Second
	// MinDiurnalStep is the shortest step of a stepped diurnal shape:
	// shorter ones shift demand many times an epoch (100,000 steps of a
	// 1s period were steps of 10µs, each an event of every stream).
	MinDiurnalStep = 100 * time.Millisecond
	// GlobalPeer names the global tier as the peer of a latency fault.
	GlobalPeer = "global"
	// maxGroupCount bounds generated tenants.
	maxGroupCount = 100000
	// MaxChaosFaults bounds the faults a chaos block draws on average,
	// (end - start) / mean_gap: the schedule is built in memory before
	// the run, so the bound keeps a typo (90ns for 90s) from exhausting it.
	MaxChaosFaults = 100000
	// MaxDuration bounds a run's duration (the field and -duration): the
	// oracle keeps per-second measures of the whole run in memory, so the
	// bound keeps a typo (100000h) from exhausting it.
	MaxDuration = 7 * 24 * time.Hour
)

// FieldError is one validation problem, naming its field path and, when
// known, the line of the document it is on. It wraps ErrInvalid and reads
// as the decoder's problems do: "invalid scenario: workload[0].cost: ...
// (line 13)".
type FieldError struct {
	Path, Message string
	// Line is the field's line in the document, or that of the entry
	// it belongs to when it was left out; 0 when unknown.
	Line int
}

func (e *FieldError) Error() string {
	m := fmt.Sprintf("%v: %s: %s", ErrInvalid, e.Path, e.Message)
	if e.Line > 0 && !messageLineRE.MatchString(e.Message) {
		m += fmt.Sprintf(" (line %d)", e.Line)
	}
	return m
}

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *FieldError) Unwrap() error { return ErrInvalid }

type problems []error

func (p *problems) add(path, format string, args ...any) {
	*p = append(*p, &FieldError{Path: path, Message: fmt.Sprintf(format, args...)})
}

// Validate applies defaults and checks every rule, returning all problems
// joined (each a *FieldError wrapping ErrInvalid), or nil. On success
// s.Config holds the parsed Sluice configuration, with generated group
// tenants listed under their tier.
func (s *Scenario) Validate() error {
	var p problems
	s.applyDefaults()
	if s.Name == "" {
		p.add("name", "is required")
	} else if err := quota.ValidateID("name", s.Name); err != nil {
		p.add("name", "%v", err)
	}
	if s.Seed == 0 {
		p.add("seed", "must be at least 1 (seeds start at 1; leave it out for 1)")
	}
	dur := time.Duration(s.Duration)
	if dur <= 0 {
		p.add("duration", "is required and must be positive")
	} else if dur > MaxDuration {
		p.add("duration", "%v is more than the longest run, %v", dur, MaxDuration)
	}
	if w := time.Duration(s.Warmup); dur > 0 && w > 0 && w >= dur {
		p.add("warmup", "%v is not shorter than the duration %v: nothing would be measured (measures and targets start after the warmup)", w, dur)
	}
	cfg := s.parseSluice(&p)
	regions := s.validateTopology(&p, cfg)
	s.validateClient(&p)
	s.validateWorkload(&p, cfg, regions)
	instances := map[string]int{}
	for _, r := range s.Topology.Regions {
		instances[r.Name] = r.Instances
	}
	for i := range s.Faults {
		validateFault(&p, fmt.Sprintf("faults[%d]", i), &s.Faults[i], regions, instances, dur, s.wrote)
	}
	validateOverlaps(&p, s.Faults, dur)
	s.validateChaos(&p, dur)
	s.validateFailovers(&p, cfg, regions, dur)
	s.validateEvents(&p, cfg, regions, dur)
	s.validateExpect(&p)
	offered := s.offeredKeys()
	for i, f := range s.Focus {
		k, ok := ParseKey(f)
		if !ok {
			p.add(fmt.Sprintf("focus[%d]", i), "%q is not tenant/class", f)
			continue
		}
		if cfg != nil {
			if _, bad := cfg.Classes[k.Class]; !bad {
				p.add(fmt.Sprintf("focus[%d]", i), "class %q is not configured", k.Class)
				continue
			}
		}
		if !offered[k] {
			// It would be charted as nothing; the busiest keys were
			// charted instead, without a word.
			p.add(fmt.Sprintf("focus[%d]", i), "%s has no traffic: no workload offers it", f)
		}
	}
	if cfg != nil && len(p) == 0 {
		s.addGroupTenants(cfg)
		if err := cfg.Validate(); err != nil {
			p.add("sluice", "with the generated tenants: %v", err)
		}
	}
	if s.written != nil && len(p) > 0 {
		// A document as written (not a shortened copy, whose lists
		// no longer match its lines): name each problem's line.
		lines := fieldLines(s.src)
		for _, e := range p {
			if fe, ok := e.(*FieldError); ok {
				fe.Line = lines.of(fe.Path)
			}
		}
	}
	if err := errors.Join(p...); err != nil {
		return err
	}
	s.Config = cfg
	return nil
}

// offeredKeys are the keys the workload offers traffic of.
func (s *Scenario) offeredKeys() map[quota.Key]bool {
	out := map[quota.Key]bool{}
	for _, w := range s.Workload {
		if w.Group == nil {
			out[quota.Key{Tenant: w.Tenant, Class: w.Class}] = true
			continue
		}
		for i := range min(w.Group.Count, maxGroupCount) {
			out[quota.Key{Tenant: GroupTenant(w.Group, i), Class: w.Class}] = true
		}
	}
	return out
}

// ParseKey reads "tenant/class".
func ParseKey(s string) (quota.Key, bool) {
	t, c, ok := strings.Cut(s, "/")
	k := quota.Key{Tenant: t, Class: c}
	return k, ok && k.Validate() == nil
}

func (s *Scenario) applyDefaults() {
	if s.Warmup == 0 && !s.NoWarmup {
		s.Warmup = Length(min(DefaultWarmup, time.Duration(s.Duration)/2))
		s.warmupDefault = true
	}
	if s.Seed == 0 && !s.wrote("seed") {
		s.Seed = 1
	}
	t := &s.Topology
	if t.SessionTTL == 0 {
		t.SessionTTL = Duration(DefaultSessionTTL)
	}
	if t.ColdStart == "" {
		t.ColdStart = "full"
	}
	if t.Latency.Local == 0 {
		t.Latency.Local = Duration(DefaultLocalLatency)
	}
	if t.Latency.Default == 0 {
		t.Latency.Default = Duration(DefaultRegionLatency)
	}
	if t.Latency.Jitter == nil {
		j := DefaultJitter
		t.Latency.Jitter = &j
	}
	for i := range s.Workload {
		w := &s.Workload[i]
		path := fmt.Sprintf("workload[%d]", i)
		if w.Cost == 0 && !s.wrote(path+".cost") {
			w.Cost = 1
		}
		if w.Process == "" {
			w.Process = "poisson"
		}
		if g := w.Group; g != nil {
			if g.Size.Alpha == 0 && !s.wrote(path+".group.size.alpha") {
				g.Size.Alpha = DefaultAlpha
			}
			if g.Size.Sigma == 0 && !s.wrote(path+".group.size.sigma") {
				g.Size.Sigma = DefaultSigma
			}
		}
		for j := range w.Shape {
			if w.Shape[j].Kind == ShapeDiurnal && w.Shape[j].Low == nil {
				low := DefaultLow
				w.Shape[j].Low = &low
			}
		}
	}
	for i := range s.Faults {
		f := &s.Faults[i]
		if f.Count == 0 && slices.Contains(faultFields[f.Kind], "count") && !s.wrote(fmt.Sprintf("faults[%d].count", i)) {
			f.Count = 1
		}
		if f.Kind == FaultGlobalLeaderLoss && f.RestartAfter == 0 {
			f.RestartAfter = Duration(DefaultGlobalRestart)
		}
	}
	if c := s.Chaos; c != nil {
		if c.MinFor == 0 {
			c.MinFor = Duration(DefaultChaosMinFor)
		}
		if c.MaxFor == 0 {
			c.MaxFor = Duration(DefaultChaosMaxFor)
		}
		if c.RestartAfter == 0 {
			c.RestartAfter = Duration(DefaultChaosRestart)
		}
		if c.Start == 0 {
			c.Start = Duration(s.Warmup)
		}
		if c.End == 0 {
			c.End = Duration(time.Duration(s.Duration) - time.Duration(c.MaxFor) - time.Minute)
			c.endDefault = true
		}
		if len(c.Kinds) == 0 {
			c.Kinds = ChaosKinds()
		}
	}
	if s.Expect.ConvergenceTolerance == 0 && !s.wrote("expect.convergence_tolerance") {
		s.Expect.ConvergenceTolerance = DefaultConvergenceTol
	}
}

func (s *Scenario) parseSluice(p *problems) *config.Config {
	if s.Sluice.Kind == 0 {
		p.add("sluice", "the Sluice configuration is required")
		return nil
	}
	data, ok := s.sluiceText()
	if !ok {
		var err error
		if data, err = yaml.Marshal(&s.Sluice); err != nil {
			p.add("sluice", "%v", err)
			return nil
		}
	}
	cfg, err := config.Parse(data)
	if err != nil {
		// The config's decoder names no field ("duration \"5\": want a
		// number with a unit (line 8)"); the file's index finds the one
		// its line and quoted value belong to (sluice.grant_validity).
		// A rule the config's validation names by its path
		// ("regions.b.weight: must be ...") is the file's field at
		// sluice.<path>, when the document wrote it.
		paths, lines := fieldPaths(s.src), fieldLines(s.src)
		errs := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		}
		for _, e := range errs {
			if fe, ok := e.(*config.FieldError); ok && fe.Path != "" {
				if _, wrote := lines["sluice."+fe.Path]; wrote {
					p.add("sluice."+fe.Path, "%s", fe.Message)
					continue
				}
			}
			m := e.Error()
			path := paths.of(m, 0, 1)
			if !strings.HasPrefix(path, "sluice.") {
				path = "sluice"
			}
			p.add(path, "%s", m)
		}
		return nil
	}
	return cfg
}

// sluiceText is the sluice block as written, at its own lines (every
// other line blanked), so the config's problems name the file's lines.
func (s *Scenario) sluiceText() ([]byte, bool) {
	n := &s.Sluice
	if len(s.src) == 0 || n.Line < 1 || n.Column < 1 {
		return nil, false
	}
	var root yaml.Node
	if yaml.Unmarshal(s.src, &root) != nil || len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, false
	}
	lines := strings.SplitAfter(string(s.src), "\n")
	end := len(lines) // the line after the block
	top := root.Content[0].Content
	found := false
	for i := 0; i+1 < len(top); i += 2 {
		if found {
			end = top[i].Line - 1
			break
		}
		found = top[i].Value == "sluice" && top[i+1].Line == n.Line && top[i+1].Column == n.Column
	}
	if !found || n.Line > len(lines) || end < n.Line {
		return nil, false
	}
	var b strings.Builder
	for range n.Line - 1 {
		b.WriteString("\n")
	}
	// The block's first line starts at its column: what precedes it on
	// that line ("sluice: " before a flow mapping) becomes spaces.
	first := []rune(lines[n.Line-1])
	if n.Column-1 > len(first) {
		return nil, false
	}
	b.WriteString(strings.Repeat(" ", n.Column-1))
	b.WriteString(string(first[n.Column-1:]))
	for _, l := range lines[n.Line:end] {
		b.WriteString(l)
	}
	return []byte(b.String()), true
}

func (s *Scenario) validateTopology(p *problems, cfg *config.Config) []string {
	t := &s.Topology
	var names []string
	seen := map[string]bool{}
	if len(t.Regions) == 0 {
		p.add("topology.regions", "at least one region is required")
	}
	for i, r := range t.Regions {
		path := fmt.Sprintf("topology.regions[%d]", i)
		if r.Name == "" {
			p.add(path+".name", "is required")
			continue
		}
		if seen[r.Name] {
			p.add(path+".name", "region %q is listed twice", r.Name)
			continue
		}
		seen[r.Name] = true
		names = append(names, r.Name)
		if cfg != nil {
			if _, ok := cfg.Regions[r.Name]; !ok {
				p.add(path+".name", "region %q is not a region of the sluice config", r.Name)
			}
		}
		if r.Instances < 1 || r.Instances > 10000 {
			p.add(path+".instances", "must be in 1..10000, got %d", r.Instances)
		}
		if off := time.Duration(r.ClockOffset); off > time.Hour || off < -time.Hour {
			p.add(path+".clock_offset", "must be within ±1h, got %v", off)
		}
	}
	if cfg != nil {
		for _, name := range sortedKeys(cfg.Regions) {
			if !seen[name] {
				p.add("topology.regions", "sluice config region %q has no topology entry", name)
			}
		}
	}
	if !seen[t.Global.Primary] {
		p.add("topology.global.primary", "%q is not a topology region", t.Global.Primary)
	}
	if t.Global.Standby != "" && !seen[t.Global.Standby] {
		p.add("topology.global.standby", "%q is not a topology region", t.Global.Standby)
	}
	if t.ColdStart != "full" && t.ColdStart != "conservative" {
		p.add("topology.cold_start", "must be full or conservative, got %q", t.ColdStart)
	}
	l := &t.Latency
	if j := *l.Jitter; !(j >= 0 && j < 1) {
		p.add("topology.latency.jitter", "must be in [0, 1), got %v", j)
	}
	if !(l.Loss >= 0 && l.Loss < 1) {
		p.add("topology.latency.loss", "must be in [0, 1), got %v", l.Loss)
	}
	for _, pair := range sortedKeys(l.Pairs) {
		a, b, ok := strings.Cut(pair, "/")
		if !ok || !seen[a] || !seen[b] || a == b {
			p.add("topology.latency.pairs."+pair, "must name two different topology regions as a/b")
		} else if other := b + "/" + a; other < pair {
			if v, both := l.Pairs[other]; both {
				// Either order names one pair: which latency it has
				// would depend on the order the two were read in.
				p.add("topology.latency.pairs."+pair, "is the pair topology.latency.pairs.%s written in the other order (%v and %v); write it once",
					other, time.Duration(v), time.Duration(l.Pairs[pair]))
			}
		}
	}
	if time.Duration(t.InstanceClockSkew) > time.Hour {
		p.add("topology.instance_clock_skew", "must be at most 1h")
	}
	return names
}

func (s *Scenario) validateClient(p *problems) {
	if n := s.Client.BreakerFailures; n < 0 || n == 0 && s.wrote("client.breaker_failures") {
		p.add("client.breaker_failures", "must be at least 1, got %d", n)
	}
}

func (s *Scenario) validateWorkload(p *problems, cfg *config.Config, regions []string) {
	if len(s.Workload) == 0 {
		p.add("workload", "at least one entry is required")
	}
	isRegion := map[string]bool{}
	for _, r := range regions {
		isRegion[r] = true
	}
	tenants := map[quota.Key]string{}
	for i := range s.Workload {
		w := &s.Workload[i]
		path := fmt.Sprintf("workload[%d]", i)
		if cfg != nil {
			if _, ok := cfg.Classes[w.Class]; !ok {
				p.add(path+".class", "class %q is not configured", w.Class)
			}
		}
		if (w.Tenant == "") == (w.Group == nil) {
			p.add(path, "exactly one of tenant and group is required")
		}
		if w.Tenant != "" {
			k := quota.Key{Tenant: w.Tenant, Class: w.Class}
			if err := k.Validate(); err != nil {
				p.add(path+".tenant", "%v", err)
			} else if prev, dup := tenants[k]; dup {
				p.add(path, "key %s is already driven by %s", k, prev)
			} else {
				tenants[k] = path
			}
			if len(w.Rate) == 0 {
				p.add(path+".rate", "a tenant needs a rate for at least one region")
			}
		}
		if w.Group != nil && len(w.Rate) > 0 {
			p.add(path+".rate", "a group draws its rates from size; leave rate out")
		}
		for _, r := range sortedKeys(w.Rate) {
			if !isRegion[r] {
				p.add(path+".rate."+r, "%q is not a topology region", r)
			}
			if v := float64(w.Rate[r]); !(v >= 0) || math.IsInf(v, 0) || v > 1e9 {
				p.add(path+".rate."+r, "must be in [0, 1e9] requests/s, got %v", v)
			}
		}
		if w.Cost < 1 || w.Cost > quota.MaxCost {
			p.add(path+".cost", "must be in 1..%d, got %d", quota.MaxCost, w.Cost)
		} else if k, burst, over := costAboveBurst(cfg, w); over {
			// The limiter refuses such a request as invalid input, not
			// over quota: the run would measure nothing but refusals.
			p.add(path+".cost", "%d exceeds the burst %d of %s: no request of it can ever be admitted", w.Cost, burst, k)
		}
		if w.Process != "poisson" && w.Process != "constant" {
			p.add(path+".process", "must be poisson or constant, got %q", w.Process)
		}
		if v := float64(w.PerInstance); v < 0 || v == 0 && s.wrote(path+".per_instance") || math.IsInf(v, 0) {
			p.add(path+".per_instance", "must be a positive rate, got %v", v)
		}
		if g := w.Group; g != nil {
			validateGroup(p, path+".group", g, cfg, s.wrote)
			if g.Regions > len(regions) {
				p.add(path+".group.regions", "%d exceeds the %d topology regions", g.Regions, len(regions))
			}
		}
		for j := range w.Shape {
			validateShape(p, fmt.Sprintf("%s.shape[%d]", path, j), &w.Shape[j], isRegion, time.Duration(s.Duration), s.wrote)
		}
	}
}

// costAboveBurst finds a key the workload drives (its tenant, or one of
// its group's) whose configured burst is below the workload's cost.
func costAboveBurst(cfg *config.Config, w *Workload) (quota.Key, int64, bool) {
	if cfg == nil {
		return quota.Key{}, 0, false
	}
	if _, ok := cfg.Classes[w.Class]; !ok {
		return quota.Key{}, 0, false
	}
	over := func(tenant string) (quota.Key, int64, bool) {
		k := quota.Key{Tenant: tenant, Class: w.Class}
		burst := int64(-1)
		if g := w.Group; g != nil && g.Tier != "" {
			// A group's tenant not listed in the config takes the
			// group's tier (addGroupTenants, after validation).
			if _, listed := cfg.Tenants[tenant]; !listed {
				if spec, ok := cfg.Tiers[g.Tier][w.Class]; ok {
					burst = int64(spec.Burst)
				}
			}
		}
		if burst < 0 {
			r, err := cfg.Resolve(k)
			if err != nil {
				return k, 0, false
			}
			burst = r.Limit.Burst
		}
		return k, burst, w.Cost > burst
	}
	if w.Group == nil {
		return over(w.Tenant)
	}
	for i := 0; i < w.Group.Count && i <= maxGroupCount; i++ {
		if k, b, ok := over(GroupTenant(w.Group, i)); ok {
			return k, b, true
		}
	}
	return quota.Key{}, 0, false
}

func validateGroup(p *problems, path string, g *Group, cfg *config.Config, wrote func(string) bool) {
	if err := quota.ValidateID(path+".prefix", g.Prefix+"0"); err != nil || g.Prefix == "" {
		p.add(path+".prefix", "must be a valid tenant id prefix, got %q", g.Prefix)
	}
	if g.Count < 1 || g.Count > maxGroupCount {
		p.add(path+".count", "must be in 1..%d, got %d", maxGroupCount, g.Count)
	}
	if g.Tier != "" && cfg != nil {
		if _, ok := cfg.Tiers[g.Tier]; !ok {
			p.add(path+".tier", "tier %q is not configured", g.Tier)
		}
	}
	if g.Regions < 0 || g.Regions == 0 && wrote(path+".regions") {
		p.add(path+".regions", "must be at least 1 (leave it out for all), got %d", g.Regions)
	}
	if !(g.HomeShare >= 0 && g.HomeShare <= 1) {
		p.add(path+".home_share", "must be in [0, 1], got %v", g.HomeShare)
	}
	sz := &g.Size
	switch sz.Dist {
	case "pareto", "lognormal", "fixed":
	default:
		p.add(path+".size.dist", "must be pareto, lognormal or fixed, got %q", sz.Dist)
	}
	if v := float64(sz.Min); !(v > 0) || v > 1e9 {
		p.add(path+".size.min", "must be a rate in (0, 1e9], got %v", v)
	}
	if v := float64(sz.Max); (v != 0 || wrote(path+".size.max")) && (v < float64(sz.Min) || v > 1e9) {
		p.add(path+".size.max", "must be at least min and at most 1e9, got %v", v)
	}
	if !(sz.Alpha > 0) || sz.Alpha > 100 {
		p.add(path+".size.alpha", "must be in (0, 100], got %v", sz.Alpha)
	}
	if !(sz.Sigma > 0) || sz.Sigma > 10 {
		p.add(path+".size.sigma", "must be in (0, 10], got %v", sz.Sigma)
	}
}

// shapeFields are the fields each shape kind reads besides kind; a shape
// setting any other is refused.
var shapeFields = map[string][]string{
	ShapeStep:    {"regions", "at", "factor"},
	ShapeFlash:   {"regions", "at", "factor", "rise", "hold", "decay"},
	ShapeDiurnal: {"regions", "period", "low", "peaks", "steps"},
}

func validateShape(p *problems, path string, sh *Shape, isRegion map[string]bool, dur time.Duration, wrote func(string) bool) {
	for i, r := range sh.Regions {
		if !isRegion[r] {
			p.add(fmt.Sprintf("%s.regions[%d]", path, i), "%q is not a topology region", r)
		}
	}
	takes, ok := shapeFields[sh.Kind]
	if !ok {
		p.add(path+".kind", "must be step, diurnal or flash, got %q", sh.Kind)
		return
	}
	for _, x := range []struct {
		name string
		set  bool
	}{
		{"at", sh.At != 0}, {"factor", sh.Factor != 0}, {"rise", sh.Rise != 0}, {"hold", sh.Hold != 0}, {"decay", sh.Decay != 0},
		{"period", sh.Period != 0}, {"low", sh.Low != nil && sh.Kind != ShapeDiurnal}, {"peaks", len(sh.Peaks) > 0}, {"steps", sh.Steps != 0},
	} {
		if (x.set || wrote(path+"."+x.name)) && !slices.Contains(takes, x.name) {
			p.add(path+"."+x.name, "does not apply to kind %s, which takes %s", sh.Kind, strings.Join(takes, ", "))
		}
	}
	if sh.Kind == ShapeStep || sh.Kind == ShapeFlash {
		what := map[string]string{ShapeStep: "a step", ShapeFlash: "a flash crowd"}[sh.Kind]
		if sh.At <= 0 {
			p.add(path+".at", "is required for %s", what)
		} else if dur > 0 && time.Duration(sh.At) >= dur {
			p.add(path+".at", "%v is not before the end of the run (%v)", time.Duration(sh.At), dur)
		}
		if sh.Factor == 0 && !wrote(path+".factor") {
			p.add(path+".factor", "is required for %s", what)
			takes = nil // no range to check
		}
	}
	switch sh.Kind {
	case ShapeStep:
		// 0 stops the traffic from At on.
		if takes != nil && (!(sh.Factor >= 0) || sh.Factor > 1e6) {
			p.add(path+".factor", "must be in [0, 1e6], got %v", sh.Factor)
		}
	case ShapeFlash:
		if takes != nil && (!(sh.Factor > 0) || sh.Factor > 1e6) {
			p.add(path+".factor", "must be in (0, 1e6], got %v", sh.Factor)
		}
		if sh.Hold <= 0 {
			p.add(path+".hold", "is required for a flash crowd")
		}
	case ShapeDiurnal:
		if sh.Period <= 0 {
			p.add(path+".period", "is required for a diurnal shape")
		} else if time.Duration(sh.Period) < MinDiurnalPeriod {
			p.add(path+".period", "must be at least %v, got %v", MinDiurnalPeriod, time.Duration(sh.Period))
		}
		if l := *sh.Low; !(l >= 0 && l <= 1) {
			p.add(path+".low", "must be in [0, 1], got %v", l)
		}
		for _, r := range sortedKeys(sh.Peaks) {
			if !isRegion[r] {
				p.add(path+".peaks."+r, "%q is not a topology region", r)
			} else if at := sh.Peaks[r]; sh.Period > 0 && time.Duration(at) >= time.Duration(sh.Period) {
				p.add(path+".peaks."+r, "%v is not within the period %v (a peak is an offset in [0, period))", time.Duration(at), time.Duration(sh.Period))
			}
		}
		if sh.Steps < 0 || sh.Steps > 100000 {
			p.add(path+".steps", "must be in 0..100000, got %d", sh.Steps)
		} else if sh.Steps > 0 && sh.Period > 0 && time.Duration(sh.Period)/time.Duration(sh.Steps) < MinDiurnalStep {
			p.add(path+".steps", "%d steps of the period %v last %v each, under %v: at most %d steps",
				sh.Steps, time.Duration(sh.Period), time.Duration(sh.Period)/time.Duration(sh.Steps), MinDiurnalStep, time.Duration(sh.Period)/MinDiurnalStep)
		}
	}
}

func validateFault(p *problems, path string, f *Fault, regions []string, instances map[string]int, dur time.Duration, wrote func(string) bool) {
	isRegion := slices.Contains[[]string, string]
	if !slices.Contains(FaultKinds(), f.Kind) {
		p.add(path+".kind", "must be one of %s, got %q", strings.Join(FaultKinds(), ", "), f.Kind)
		return
	}
	if dur > 0 && time.Duration(f.At) >= dur {
		p.add(path+".at", "%v is not before the end of the run (%v)", time.Duration(f.At), dur)
	}
	takes := faultFields[f.Kind]
	for _, x := range []struct {
		name string
		set  bool
	}{
		{"peer", f.Peer != ""}, {"count", f.Count != 0}, {"for", f.For != 0}, {"restart_after", f.RestartAfter != 0},
		{"latency", f.Latency != 0}, {"loss", f.Loss != 0},
	} {
		if (x.set || wrote(path+"."+x.name)) && !slices.Contains(takes, x.name) {
			p.add(path+"."+x.name, "does not apply to kind %s, which takes %s", f.Kind, strings.Join(takes, ", "))
		}
	}
	needRegion := map[string]bool{
		FaultInstanceCrash: true, FaultInstanceStop: true, FaultRegionLeaderLoss: true,
		FaultPartition: true, FaultRedisRestart: true, FaultLatency: true,
		FaultReplyLoss: true, FaultReportReplay: true, FaultRegionReportReplay: true, FaultStaleLeader: true,
		FaultInstanceIsolate: true, FaultRegionDown: true,
	}
	if needRegion[f.Kind] && !isRegion(regions, f.Region) {
		p.add(path+".region", "%q is not a topology region", f.Region)
	}
	if !needRegion[f.Kind] && f.Region != "" {
		p.add(path+".region", "a %s fault takes no region", f.Kind)
	}
	needFor := f.Kind == FaultPartition || f.Kind == FaultRedisRestart || f.Kind == FaultEtcdDown || f.Kind == FaultLoss ||
		needRegion[f.Kind] && (f.Kind == FaultReplyLoss || f.Kind == FaultReportReplay || f.Kind == FaultRegionReportReplay || f.Kind == FaultStaleLeader || f.Kind == FaultInstanceIsolate)
	if needFor && f.For <= 0 {
		p.add(path+".for", "is required for a %s fault", f.Kind)
	}
	if !slices.Contains(takes, "count") {
		// Refused above when set.
	} else if f.Count < 1 || f.Count > 10000 {
		p.add(path+".count", "must be in 1..10000, got %d", f.Count)
	} else if n, ok := instances[f.Region]; ok && f.Count > n && (f.Kind == FaultInstanceCrash || f.Kind == FaultInstanceStop || f.Kind == FaultInstanceIsolate) {
		p.add(path+".count", "%d is more than the %d instances region %s runs", f.Count, n, f.Region)
	}
	switch f.Kind {
	case FaultLatency:
		if f.Peer != GlobalPeer && (!isRegion(regions, f.Peer) || f.Peer == f.Region) {
			p.add(path+".peer", "must be another topology region or %q, got %q", GlobalPeer, f.Peer)
		}
		if f.Latency <= 0 {
			p.add(path+".latency", "is required for a latency fault")
		}
	case FaultLoss, FaultReplyLoss, FaultReportReplay:
		if !(f.Loss > 0 && f.Loss <= 1) {
			p.add(path+".loss", "must be in (0, 1], got %v", f.Loss)
		}
	}
	if f.RedisLost && (f.Kind != FaultRegionDown || f.RestartAfter <= 0) {
		p.add(path+".redis_lost", "applies only to a region-down fault with restart_after")
	}
	if f.RestartAfter < 0 {
		p.add(path+".restart_after", "must not be negative")
	}
}

// faultFields are the fields each fault kind reads besides at and kind;
// a fault setting any other is refused.
var faultFields = map[string][]string{
	FaultInstanceCrash:      {"region", "count", "restart_after"},
	FaultInstanceStop:       {"region", "count", "restart_after"},
	FaultInstanceIsolate:    {"region", "count", "for"},
	FaultRegionLeaderLoss:   {"region"},
	FaultGlobalLeaderLoss:   {"restart_after"},
	FaultPartition:          {"region", "for"},
	FaultRedisRestart:       {"region", "for"},
	FaultEtcdDown:           {"for"},
	FaultLatency:            {"region", "peer", "latency", "for"},
	FaultLoss:               {"loss", "for"},
	FaultReplyLoss:          {"region", "loss", "for"},
	FaultReportReplay:       {"region", "loss", "for"},
	FaultRegionReportReplay: {"region", "for"},
	FaultStaleLeader:        {"region", "for"},
	FaultRegionDown:         {"region", "restart_after", "redis_lost"},
}

// overlapping are the fault kinds that set a state of their target for a
// time and restore it after: two of one kind on one target at once are
// played as one that ends when the first ends (a link healed while the
// second partition still runs), so they are refused.
var overlapping = map[string]bool{
	FaultPartition: true, FaultRedisRestart: true, FaultEtcdDown: true, FaultLatency: true, FaultLoss: true,
	FaultReplyLoss: true, FaultReportReplay: true, FaultRegionReportReplay: true, FaultStaleLeader: true,
	FaultRegionDown: true,
}

// span is the time a fault holds its target: [At, end).
func (f *Fault) span(dur time.Duration) (from, to time.Duration) {
	from = time.Duration(f.At)
	switch {
	case f.Kind == FaultRegionDown && f.RestartAfter > 0:
		return from, from + time.Duration(f.RestartAfter)
	case f.Kind == FaultRegionDown, f.Kind == FaultLatency && f.For <= 0:
		return from, max(dur, from+1)
	}
	return from, from + time.Duration(f.For)
}

// target names what a fault holds: its region, a latency fault's pair of
// ends, "" for the fleet-wide kinds.
func (f *Fault) target() string {
	if f.Kind == FaultLatency {
		a, b := f.Region, f.Peer
		if b < a && b != GlobalPeer {
			a, b = b, a
		}
		return a + "↔" + b
	}
	return f.Region
}

// validateOverlaps refuses two faults of one kind on one target whose
// times overlap, naming both.
func validateOverlaps(p *problems, faults []Fault, dur time.Duration) {
	for j := range faults {
		b := &faults[j]
		if !overlapping[b.Kind] {
			continue
		}
		bFrom, bTo := b.span(dur)
		for i := range j {
			a := &faults[i]
			if a.Kind != b.Kind || a.target() != b.target() {
				continue
			}
			aFrom, aTo := a.span(dur)
			if aFrom < bTo && bFrom < aTo {
				on := ""
				if t := a.target(); t != "" {
					on = " on " + t
				}
				p.add(fmt.Sprintf("faults[%d]", j), "overlaps faults[%d]: two %s faults%s at once (%v–%v and %v–%v) are played as one that ends with the first; merge them into one or let one end before the other starts",
					i, b.Kind, on, aFrom, aTo, bFrom, bTo)
				break
			}
		}
	}
}

func (s *Scenario) validateFailovers(p *problems, cfg *config.Config, regions []string, dur time.Duration) {
	for i, f := range s.Failovers {
		path := fmt.Sprintf("failovers[%d]", i)
		if dur > 0 && (f.At < 0 || time.Duration(f.At) >= dur) {
			p.add(path+".at", "%v is not within the run (%v)", time.Duration(f.At), dur)
		}
		if !slices.Contains(regions, f.From) {
			p.add(path+".from", "%q is not a topology region", f.From)
		}
		if len(f.To) == 0 {
			p.add(path+".to", "at least one region is required")
		}
		for j, to := range f.To {
			switch {
			case !slices.Contains(regions, to):
				p.add(fmt.Sprintf("%s.to[%d]", path, j), "%q is not a topology region", to)
			case to == f.From:
				p.add(fmt.Sprintf("%s.to[%d]", path, j), "users cannot fail over to the region they leave")
			case slices.Contains(f.To[:j], to):
				p.add(fmt.Sprintf("%s.to[%d]", path, j), "%q is listed twice", to)
			}
		}
		if f.For < 0 {
			p.add(path+".for", "must not be negative")
		}
	}
}

// validateEvents checks every event and that no moment of the run has
// every region drained (the config would be refused).
func (s *Scenario) validateEvents(p *problems, cfg *config.Config, regions []string, dur time.Duration) {
	drained := map[string]bool{}
	if cfg != nil {
		for name, r := range cfg.Regions {
			drained[name] = r.Drained
		}
	}
	order := make([]int, len(s.Events))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return s.Events[order[a]].At < s.Events[order[b]].At })
	for _, i := range order {
		e := s.Events[i]
		path := fmt.Sprintf("events[%d]", i)
		if dur > 0 && (e.At < 0 || time.Duration(e.At) >= dur) {
			p.add(path+".at", "%v is not within the run (%v)", time.Duration(e.At), dur)
		}
		if e.Kind != EventDrain && e.Kind != EventRestore {
			p.add(path+".kind", "must be %s or %s, got %q", EventDrain, EventRestore, e.Kind)
			continue
		}
		if !slices.Contains(regions, e.Region) {
			p.add(path+".region", "%q is not a topology region", e.Region)
			continue
		}
		drained[e.Region] = e.Kind == EventDrain
		all := len(drained) > 0
		for _, d := range drained {
			all = all && d
		}
		if all {
			p.add(path, "drains the last serving region (the config would be refused)")
		}
	}
}

func (s *Scenario) validateChaos(p *problems, dur time.Duration) {
	c := s.Chaos
	if c == nil {
		return
	}
	switch span := time.Duration(c.End - c.Start); {
	case c.MeanGap <= 0:
		p.add("chaos.mean_gap", "is required")
	case time.Duration(c.MeanGap) < time.Millisecond:
		// Fault starts are whole milliseconds: a shorter gap would
		// draw faults that all start at the same instant.
		p.add("chaos.mean_gap", "must be at least 1ms, got %v", time.Duration(c.MeanGap))
	case span > 0 && span/time.Duration(c.MeanGap) > MaxChaosFaults:
		p.add("chaos.mean_gap", "%v draws about %d faults between start %v and end %v; at most %d",
			time.Duration(c.MeanGap), span/time.Duration(c.MeanGap), time.Duration(c.Start), time.Duration(c.End), MaxChaosFaults)
	}
	for i, k := range c.Kinds {
		if !slices.Contains(FaultKinds(), k) {
			p.add(fmt.Sprintf("chaos.kinds[%d]", i), "must be one of %s, got %q", strings.Join(FaultKinds(), ", "), k)
		}
	}
	if c.MinFor > c.MaxFor {
		p.add("chaos.min_for", "%v exceeds max_for %v", time.Duration(c.MinFor), time.Duration(c.MaxFor))
	}
	switch {
	case c.endDefault && c.End < c.Start && time.Duration(c.End) == dur-time.Duration(c.MaxFor)-time.Minute:
		// Not a consequence of another field's problem: the run is too
		// short for the default window.
		p.add("chaos.end", "left out, it is the duration %v − max_for %v − 1m = %v, before start %v: set it, or run longer",
			dur, time.Duration(c.MaxFor), time.Duration(c.End), time.Duration(c.Start))
	case c.End < c.Start || time.Duration(c.End) > dur:
		p.add("chaos.end", "%v must be between start %v and the duration %v (the run may be too short for max_for + 1m)",
			time.Duration(c.End), time.Duration(c.Start), dur)
	}
}

func (s *Scenario) validateExpect(p *problems) {
	e := &s.Expect
	for _, f := range []struct {
		name string
		v    *int
	}{{"conformance_violations_max", e.ConformanceViolationsMax}, {"rate_violations_max", e.RateViolationsMax}, {"burst_violations_max", e.BurstViolationsMax}} {
		if f.v != nil && *f.v < 0 {
			p.add("expect."+f.name, "must not be negative, got %d", *f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    *float64
	}{{"utilization_60s_min", e.Utilization60sMin}, {"utilization_1s_mean_min", e.Utilization1sMeanMin},
		{"false_rejects_max", e.FalseRejectsMax}, {"fairness_error_max", e.FairnessErrorMax}, {"crash_error_max", e.CrashErrorMax},
		{"recovered_vs_ideal_min", e.RecoveredVsIdealMin}, {"recovered_false_rejects_max", e.RecoveredFalseRejectsMax}} {
		if f.v != nil && !(*f.v >= 0 && *f.v <= 1) {
			p.add("expect."+f.name, "must be a fraction in [0, 1], got %v", *f.v)
		}
	}
	if v := e.ConvergenceEpochsMax; v != nil && !(*v >= 0) {
		p.add("expect.convergence_epochs_max", "must not be negative, got %v", *v)
	}
	if (e.RecoveredVsIdealMin != nil || e.RecoveredFalseRejectsMax != nil) && e.Recovery <= 0 {
		p.add("expect.recovery", "is required by the recovered_* targets")
	}
	if e.Recovery < 0 {
		p.add("expect.recovery", "must not be negative")
	}
	if !(e.ConvergenceTolerance > 0 && e.ConvergenceTolerance < 1) {
		p.add("expect.convergence_tolerance", "must be in (0, 1), got %v", e.ConvergenceTolerance)
	}
}

// addGroupTenants lists every generated tenant with its group's tier.
func (s *Scenario) addGroupTenants(cfg *config.Config) {
	for _, w := range s.Workload {
		g := w.Group
		if g == nil || g.Tier == "" {
			continue
		}
		if cfg.Tenants == nil {
			cfg.Tenants = map[string]config.Tenant{}
		}
		for i := 0; i < g.Count; i++ {
			id := GroupTenant(g, i)
			if _, listed := cfg.Tenants[id]; !listed {
				cfg.Tenants[id] = config.Tenant{Tier: g.Tier}
			}
		}
	}
}

// GroupTenant is the id of a group's i-th tenant.
func GroupTenant(g *Group, i int) string {
	width := len(fmt.Sprint(g.Count - 1))
	return fmt.Sprintf("%s%0*d", g.Prefix, width, i)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
