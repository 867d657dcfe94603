// Package importer turns envoyproxy/ratelimit config files (a domain and
// its nested descriptors, as that service loads them from a directory)
// into the equivalent Sluice config: one envoy.domains tree per domain,
// node for node, and one class per rate limit, so Envoy can be pointed at
// Sluice's RateLimitService without changing its rate_limits actions.
//
// # Mapping
//
//   - A descriptor with rate_limit {requests_per_unit: n, unit: u} becomes
//     a node naming a new class "<domain>.<name>" (name: the rate limit's
//     name, else the descriptor's path as envoyproxy/ratelimit writes it in
//     its stats, key_value joined by "."; bytes a class name cannot hold
//     become "_"), limited in every tier to rate n/u and burst n. A token
//     bucket of burst n refilling n per unit admits at most 2n in any
//     window of one unit, the same bound as the fixed windows of
//     envoyproxy/ratelimit, and never more than n at once.
//   - rate_limit {unlimited: true} becomes unlimited: true, and so does a
//     descriptor with neither a rate limit nor nested descriptors (for
//     envoyproxy/ratelimit such a descriptor has no limit but still takes
//     precedence over a sibling without a value). Both services answer
//     such a descriptor OK and charge nothing; on the wire Sluice's status
//     says limit_remaining 2^32-1, as for unlimited, where
//     envoyproxy/ratelimit's says 0 with no current_limit, as for a
//     descriptor it does not know.
//   - shadow_mode carries over on limited descriptors; on others it does
//     nothing in either service and is dropped with a note.
//   - A value holding * is a wildcard pattern in both services, each *
//     any run of bytes (none too), anywhere in the value: "files/*" a
//     prefix, "/api/*/action" a prefix and a suffix, and
//     "/api/*/resource/*" pieces in order; share_threshold (one counter
//     for every value a pattern matches) carries over. A value with a *
//     before its end is named in a note: releases of
//     envoyproxy/ratelimit from before it took such a * as a wildcard
//     matched it as itself, and Sluice has no literal *.
//   - detailed_metric, value_to_metric and metadata are dropped with a
//     note: they shape only envoyproxy/ratelimit's metrics and the
//     dynamic metadata of its answers, and Sluice's metrics never carry
//     descriptor values.
//   - replaces, quota_mode, and requests_per_unit 0 (a block list), have
//     no Sluice equivalent and are refused, each with the reason. A
//     requests_per_unit that is not a whole number (5.5, 1e3) is refused
//     as written, as envoyproxy/ratelimit refuses it, not cut to one.
//   - A descriptor without a value, or with a pattern (without
//     share_threshold), gives each value its own bucket in both services.
//     A note names those that limit something: Sluice limits a value of
//     other bytes than letters, digits and . _ @ - (a path, an IPv6
//     address, text), or a tuple holding one, under a tenant of ':' and 32
//     hex digits (see package envoyrls, "Tenants"), which only the default
//     tier and a tenant listed by that name reach; a pattern whose fixed
//     part holds such a byte is named on its own, every value it matches
//     being limited so.
//
// Every problem names the file and the descriptor's path in it
// (descriptors[1].descriptors[0]), also those the Sluice config's rules
// find in the converted trees.
//
// Class settings of a class the base config already has are kept (a
// re-import updates only its limits); new classes get the defaults. A
// domain already under envoy.domains is replaced.
package importer

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// ErrInvalid is wrapped by every error about the files' content.
var ErrInvalid = errors.New("invalid envoy ratelimit config")

// File is one envoyproxy/ratelimit config file.
type File struct {
	// Name is where the file came from, for messages.
	Name        string
	Domain      string       `yaml:"domain"`
	Descriptors []Descriptor `yaml:"descriptors"`
}

// Descriptor is one descriptor of an envoyproxy/ratelimit config.
type Descriptor struct {
	Key            string     `yaml:"key"`
	Value          string     `yaml:"value"`
	RateLimit      *RateLimit `yaml:"rate_limit"`
	ShadowMode     bool       `yaml:"shadow_mode"`
	QuotaMode      bool       `yaml:"quota_mode"`
	DetailedMetric bool       `yaml:"detailed_metric"`
	ValueToMetric  bool       `yaml:"value_to_metric"`
	ShareThreshold bool       `yaml:"share_threshold"`
	// Metadata is any mapping; envoyproxy/ratelimit returns it in the
	// dynamic metadata of its answers, Sluice ignores it.
	Metadata    map[string]any `yaml:"metadata"`
	Descriptors []Descriptor   `yaml:"descriptors"`
}

// RateLimit is a descriptor's rate_limit block.
type RateLimit struct {
	Unit            string    `yaml:"unit"`
	RequestsPerUnit *int64    `yaml:"requests_per_unit"`
	Unlimited       bool      `yaml:"unlimited"`
	Name            string    `yaml:"name"`
	Replaces        []Replace `yaml:"replaces"`

	// fraction is requests_per_unit as written when it is not a whole
	// number (5.5, 1e3), which the decoder would have cut to one.
	fraction string
}

// UnmarshalYAML decodes the block as written, with the decoder's own
// strictness, and keeps a requests_per_unit that is not a whole number
// as written: yaml cuts 5.5 to 5 in an integer, where
// envoyproxy/ratelimit refuses the file.
func (rl *RateLimit) UnmarshalYAML(unmarshal func(any) error) error {
	type plain RateLimit
	if err := unmarshal((*plain)(rl)); err != nil {
		return err
	}
	var raw map[string]yaml.Node
	if err := unmarshal(&raw); err != nil {
		return err
	}
	n, ok := raw["requests_per_unit"]
	if ok && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = *n.Alias
	}
	if ok && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float" {
		rl.fraction = n.Value
	}
	return nil
}

// Replace is one entry of rate_limit.replaces.
type Replace struct {
	Name string `yaml:"name"`
}

var unitSeconds = map[string]float64{"second": 1, "minute": 60, "hour": 3600, "day": 86400}

// ReadDir reads every *.yaml and *.yml file directly in dir (not in
// subdirectories; names starting with "." are skipped), in name order.
// skipped names, one sentence each, every other entry of dir:
// envoyproxy/ratelimit loads every file under its directory, of any
// name and in subdirectories too, so an entry not read here may hold
// limits that applied there.
func ReadDir(dir string) (files []File, skipped []string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, e := range entries {
		name := e.Name()
		ext := filepath.Ext(name)
		switch {
		case e.IsDir():
			skipped = append(skipped, fmt.Sprintf("%s/ not read: a directory (envoyproxy/ratelimit also loads the files under it; import it on its own)", name))
			continue
		case strings.HasPrefix(name, "."):
			skipped = append(skipped, fmt.Sprintf("%s not read: its name starts with \".\"", name))
			continue
		case ext != ".yaml" && ext != ".yml":
			skipped = append(skipped, fmt.Sprintf("%s not read: not a .yaml or .yml file", name))
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, nil, err
		}
		f, err := Parse(name, data)
		if err != nil {
			return nil, nil, err
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		msg := fmt.Sprintf("%s holds no .yaml or .yml file", dir)
		if len(skipped) > 0 {
			msg += " (" + strings.Join(skipped, "; ") + ")"
		}
		return nil, nil, fmt.Errorf("%w: %s", ErrInvalid, msg)
	}
	return files, skipped, nil
}

var unknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type \S+`)

// Parse reads one file strictly: a field envoyproxy/ratelimit does not
// know is an error naming it and its line, and so is a second YAML
// document (envoyproxy/ratelimit reads only the first).
func Parse(name string, data []byte) (File, error) {
	f := File{Name: name}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return File{}, fmt.Errorf("%w: %s: the file is empty", ErrInvalid, name)
		}
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		var te *yaml.TypeError
		if errors.As(err, &te) {
			msg = strings.Join(te.Errors, "; ")
		}
		msg = unknownField.ReplaceAllString(msg, `unknown field $2 (line $1)`)
		return File{}, fmt.Errorf("%w: %s: %s", ErrInvalid, name, msg)
	}
	// envoyproxy/ratelimit reads a file's first YAML document only: the
	// limits of any other never applied there, and are not taken here
	// without a word.
	var next yaml.Node
	if err := dec.Decode(&next); err == nil && len(next.Content) > 0 && next.Content[0].Tag != "!!null" {
		return File{}, fmt.Errorf("%w: %s: line %d: a second YAML document: envoyproxy/ratelimit reads only the first document of a file, so its limits never applied there; put each domain in a file of its own, or remove the rest", ErrInvalid, name, next.Content[0].Line)
	} else if err != nil && !errors.Is(err, io.EOF) {
		return File{}, fmt.Errorf("%w: %s: %s", ErrInvalid, name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	f.Name = name
	return f, nil
}

// Result is a conversion: the new config and what the reader should know.
type Result struct {
	Config *config.Config
	// Notes say what was dropped or left alone, one sentence each.
	Notes []string
}

// Convert merges files into a copy of base (which must be valid; it is
// not changed) and validates the result. Every problem of every file is
// reported at once, each naming the file and the descriptor's path.
func Convert(base *config.Config, files []File) (Result, error) {
	next, err := clone(base)
	if err != nil {
		return Result{}, fmt.Errorf("the base config: %w", err)
	}
	c := converter{cfg: next, used: map[string]bool{}}
	domains := map[string]string{}
	fileOf := map[string]string{} // "envoy.domains[i]" → the file of its tree
	for _, f := range files {
		if f.Domain == "" {
			c.fail("%s: domain: is required", f.Name)
			continue
		}
		if other, dup := domains[f.Domain]; dup {
			c.fail("%s: domain %q is also the domain of %s (merge the files into one)", f.Name, f.Domain, other)
			continue
		}
		domains[f.Domain] = f.Name
		if len(f.Descriptors) == 0 {
			c.fail("%s: descriptors: the file has none", f.Name)
			continue
		}
		for _, m := range next.Envoy.Descriptors {
			if m.Domain == f.Domain {
				c.note("domain %q also has an envoy.descriptors mapping (tenant_key %q); it is tried before the imported tree", f.Domain, m.TenantKey)
				break
			}
		}
		tree := config.EnvoyDomain{Domain: f.Domain}
		tree.Descriptors = c.nodes(f.Name, f.Domain, "descriptors", "", f.Descriptors)
		old := next.EnvoyTree(f.Domain)
		if old != nil {
			*old = tree
		} else {
			next.Envoy.Domains = append(next.Envoy.Domains, tree)
		}
		for i := range next.Envoy.Domains {
			if next.Envoy.Domains[i].Domain == f.Domain {
				fileOf["envoy.domains["+strconv.Itoa(i)+"]"] = f.Name
			}
		}
	}
	if len(c.errs) > 0 {
		return Result{}, errors.Join(c.errs...)
	}
	if len(c.wild) > 0 {
		c.note("each value of a descriptor without a value or with a wildcard pattern (without share_threshold) has a bucket of its own in each limit at or under it (%s); a value of other bytes than letters, digits and . _ @ - (a path, an IPv6 address, text), or a tuple holding one, is limited under a tenant of ':' and 32 hex digits, in the default tier",
			strings.Join(c.wild, "; "))
	}
	for _, name := range unreferenced(base, next) {
		c.note("class %q is no longer named by envoy.domains; remove it if nothing else uses it", name)
	}
	// Marshal and Parse apply the defaults of the new classes and check
	// every rule, as sluicectl apply would.
	data, err := next.Marshal()
	if err != nil {
		return Result{}, err
	}
	out, err := config.Parse(data)
	if err != nil {
		return Result{}, fmt.Errorf("the imported config does not validate: %w", inFiles(err, fileOf))
	}
	return Result{Config: out, Notes: c.notes}, nil
}

type converter struct {
	cfg   *config.Config
	used  map[string]bool // class names given out by this import
	errs  []error
	notes []string
	// wild names the descriptors without a value or with a pattern
	// without share_threshold that have a limit at or under them.
	wild []string
}

func (c *converter) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...))
}

func (c *converter) note(format string, args ...any) {
	c.notes = append(c.notes, fmt.Sprintf(format, args...))
}

// nodes converts one descriptor list; path names it in messages, stat is
// the parent's envoyproxy/ratelimit stats name.
func (c *converter) nodes(file, domain, path, stat string, ds []Descriptor) []config.EnvoyNode {
	out := make([]config.EnvoyNode, 0, len(ds))
	for i, d := range ds {
		p := fmt.Sprintf("%s[%d]", path, i)
		where := fmt.Sprintf("%s: %s (key %q)", file, p, d.Key)
		if d.Key == "" {
			c.fail("%s: %s.key: is required", file, p)
			continue
		}
		name := d.Key
		if d.Value != "" {
			name += "_" + d.Value
		}
		if stat != "" {
			name = stat + "." + name
		}
		n := config.EnvoyNode{Key: d.Key, Value: d.Value, ShareThreshold: d.ShareThreshold}
		if i := strings.IndexByte(d.Value, '*'); i >= 0 && i < len(d.Value)-1 {
			c.note("%s: value %q: each * matches any run of bytes, anywhere in the value, as in envoyproxy/ratelimit since it took a * before the end as a wildcard; its earlier releases matched such a * as itself", where, d.Value)
		}
		if d.ShareThreshold && !n.Pattern() {
			c.fail("%s: share_threshold needs a value holding a * (a wildcard pattern), in envoyproxy/ratelimit too", where)
		}
		if n.Pattern() && !n.ShareThreshold && !plain(strings.ReplaceAll(d.Value, "*", "")) {
			c.note("%s: every value matching %q holds bytes other than letters, digits and . _ @ -, so each is limited under a tenant of ':' and 32 hex digits, in the default tier", where, d.Value)
		}
		if d.QuotaMode {
			c.fail("%s: quota_mode has no Sluice equivalent: envoyproxy/ratelimit refuses a request over a quota_mode descriptor only when every quota_mode descriptor of the request is over its limit, and Sluice refuses a request when any of its descriptors is; remove quota_mode to limit the descriptor as any other, or use shadow_mode to only count it", where)
		}
		if d.DetailedMetric {
			c.note("%s: detailed_metric dropped: Sluice's metrics never carry descriptor values", where)
		}
		if d.ValueToMetric {
			c.note("%s: value_to_metric dropped: Sluice's metrics never carry descriptor values", where)
		}
		if len(d.Metadata) > 0 {
			c.note("%s: metadata dropped: Sluice's answers carry no dynamic metadata (envoyproxy/ratelimit returns it with the descriptors within their limits)", where)
		}
		rl := d.RateLimit
		switch {
		case rl != nil && len(rl.Replaces) > 0:
			c.fail("%s: rate_limit.replaces has no Sluice equivalent (Sluice charges a request's descriptors in order until one is over its limit, and none replaces another); give the descriptors distinct limits instead", where)
		case rl != nil && rl.Unlimited:
			if rl.Unit != "" || rl.RequestsPerUnit != nil {
				c.fail("%s: rate_limit: unlimited takes no unit or requests_per_unit", where)
			}
			n.Unlimited = true
		case rl != nil:
			c.limit(&n, where, domain, name, rl)
			n.ShadowMode = d.ShadowMode && n.Class != ""
		case len(d.Descriptors) == 0:
			// No limit: envoyproxy/ratelimit answers OK, and the node still
			// wins over a sibling without a value.
			n.Unlimited = true
		}
		if d.ShadowMode && !n.ShadowMode && (rl == nil || rl.Unlimited) {
			c.note("%s: shadow_mode dropped: the descriptor has no limit to shadow", where)
		}
		n.Descriptors = c.nodes(file, domain, p+".descriptors", name, d.Descriptors)
		// A value that reaches no limit has no bucket: an unlimited node
		// and one whose subtree is unlimited are not named.
		if !n.Named() && limits(&n) {
			c.wild = append(c.wild, where)
		}
		out = append(out, n)
	}
	return out
}

// limits says whether n or a node under it names a class.
func limits(n *config.EnvoyNode) bool {
	if n.Class != "" {
		return true
	}
	for i := range n.Descriptors {
		if limits(&n.Descriptors[i]) {
			return true
		}
	}
	return false
}

func (c *converter) limit(n *config.EnvoyNode, where, domain, stat string, rl *RateLimit) {
	seconds, ok := unitSeconds[strings.ToLower(rl.Unit)]
	switch {
	case !ok:
		c.fail("%s: rate_limit.unit %q: want second, minute, hour or day", where, rl.Unit)
		return
	case rl.fraction != "":
		c.fail("%s: rate_limit.requests_per_unit %s: want a whole number in 1..4294967295", where, rl.fraction)
		return
	case rl.RequestsPerUnit == nil:
		c.fail("%s: rate_limit.requests_per_unit: is required", where)
		return
	case *rl.RequestsPerUnit == 0:
		c.fail("%s: rate_limit.requests_per_unit 0 (refuse every request) has no Sluice equivalent: Sluice limits have a rate > 0; block such requests in Envoy (e.g. an RBAC filter)", where)
		return
	case *rl.RequestsPerUnit < 0 || *rl.RequestsPerUnit > 1<<32-1:
		c.fail("%s: rate_limit.requests_per_unit %d: want a whole number in 1..4294967295", where, *rl.RequestsPerUnit)
		return
	case *rl.RequestsPerUnit > quota.MaxBurst:
		// envoyproxy/ratelimit takes up to 2^32-1; the burst it becomes
		// must fit Sluice's largest (the scripts' micro-token sums).
		c.fail("%s: rate_limit.requests_per_unit %d is above %d, the largest burst a Sluice limit holds (requests_per_unit becomes the burst)", where, *rl.RequestsPerUnit, quota.MaxBurst)
		return
	}
	if rl.Name != "" {
		stat = rl.Name
	}
	class := c.className(domain + "." + stat)
	perUnit := *rl.RequestsPerUnit
	spec := config.LimitSpec{Rate: config.Rate(float64(perUnit) / seconds), Burst: float64(perUnit)}
	if c.cfg.Classes == nil {
		c.cfg.Classes = map[string]config.Class{}
	}
	if _, ok := c.cfg.Classes[class]; !ok {
		c.cfg.Classes[class] = config.Class{}
	}
	for _, tier := range c.cfg.Tiers {
		tier[class] = spec
	}
	n.Class = class
}

// className makes a class name unique in this import from s: bytes a
// class cannot hold become "_", and a name too long keeps its start and a
// hash of the whole.
func (c *converter) className(s string) string {
	b := []byte(s)
	for i, ch := range b {
		if !validByte(ch) {
			b[i] = '_'
		}
	}
	name := fit(string(b), s)
	for i := 2; c.used[name]; i++ {
		name = fit(fmt.Sprintf("%s.%d", b, i), fmt.Sprintf("%s.%d", s, i))
	}
	c.used[name] = true
	return name
}

// fit shortens name to quota.MaxClassLen, ending it in a hash of whole
// when it is longer.
func fit(name, whole string) string {
	if len(name) <= quota.MaxClassLen {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(whole))
	suffix := fmt.Sprintf("-%08x", h.Sum32())
	return name[:quota.MaxClassLen-len(suffix)] + suffix
}

// DigestedPrefixes names, one sentence each, the envoy.domains nodes of
// cfg whose wildcard pattern (without share_threshold) has a fixed part
// holding a byte no plain tenant value holds (a path's '/', an address's
// ':'): every value such a node matches is limited under a digest tenant,
// ':' and 32 hex digits (see package envoyrls, "Tenants"), which only the
// default tier and a tenant listed by that name reach. sluicectl validate
// prints them as notes.
func DigestedPrefixes(cfg *config.Config) []string {
	var out []string
	var walk func(path string, nodes []config.EnvoyNode)
	walk = func(path string, nodes []config.EnvoyNode) {
		for i := range nodes {
			n := &nodes[i]
			p := path + "[" + strconv.Itoa(i) + "]"
			if n.Pattern() && !n.ShareThreshold && !plain(strings.ReplaceAll(n.Value, "*", "")) {
				out = append(out, fmt.Sprintf("%s (key %q): every value matching %q holds bytes other than letters, digits and . _ @ -, so each is limited under a tenant of ':' and 32 hex digits, in the default tier", p, n.Key, n.Value))
			}
			walk(p+".descriptors", n.Descriptors)
		}
	}
	for i, d := range cfg.Envoy.Domains {
		walk("envoy.domains["+strconv.Itoa(i)+"].descriptors", d.Descriptors)
	}
	return out
}

// plain says whether s holds only bytes of a plain tenant value (see
// envoyrls.TreeTenant): a class name's bytes but ':'.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == ':' || !validByte(s[i]) {
			return false
		}
	}
	return true
}

// inFiles rewrites the problems config validation found in the imported
// trees (paths under envoy.domains[i], per fileOf) to name the file and
// the descriptor's path in it, as the importer's own problems do; the
// others are left as they are.
func inFiles(err error, fileOf map[string]string) error {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		var fe *config.FieldError
		if !errors.As(e, &fe) {
			out = append(out, e)
			continue
		}
		prefix, _, _ := strings.Cut(fe.Path, ".")
		if i := strings.Index(fe.Path, "]"); strings.HasPrefix(fe.Path, "envoy.domains[") && i > 0 {
			prefix = fe.Path[:i+1]
		}
		file, ok := fileOf[prefix]
		if !ok {
			out = append(out, e)
			continue
		}
		rest := strings.TrimPrefix(strings.TrimPrefix(fe.Path, prefix), ".")
		msg := strings.ReplaceAll(fe.Message, prefix+".", "")
		out = append(out, fmt.Errorf("%w: %s: %s: %s", config.ErrInvalidConfig, file, rest, msg))
	}
	return errors.Join(out...)
}

func validByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == ':' || c == '@' || c == '-'
}

// unreferenced lists the classes base's trees named that next's trees no
// longer name.
func unreferenced(base, next *config.Config) []string {
	was, is := map[string]bool{}, map[string]bool{}
	for _, d := range base.Envoy.Domains {
		collect(d.Descriptors, was)
	}
	for _, d := range next.Envoy.Domains {
		collect(d.Descriptors, is)
	}
	var out []string
	for name := range was {
		if !is[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func collect(nodes []config.EnvoyNode, into map[string]bool) {
	for _, n := range nodes {
		if n.Class != "" {
			into[n.Class] = true
		}
		collect(n.Descriptors, into)
	}
}

func clone(c *config.Config) (*config.Config, error) {
	data, err := c.Marshal()
	if err != nil {
		return nil, err
	}
	return config.Parse(data)
}
