package config

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Tenants are the part of a config that grows with the business, so they
// are read apart from the rest: the lines of a block-style top-level
// "tenants:" mapping are cut into runs of tenantBatch entries, each parsed
// on its own and decoded by hand (decodeTenant), and the rest of the
// document, with those lines blanked so that line numbers hold, is decoded
// strictly as before. Time and memory are linear in the document: the YAML
// decoder's own check for duplicate mapping keys compares every key with
// every other (quadratic: 40,000 tenants took 27 s, 400,000 ran for
// minutes), and its node tree of a whole large document is many times the
// document's size. A tenants mapping in another form (flow style, anchors
// across entries) is read whole, up to MaxInlineTenants.

// tenantBatch is how many tenant entries are parsed at once.
const tenantBatch = 512

// tenantBlock is where a block-style top-level tenants mapping lies.
type tenantBlock struct {
	// rest is the document with the tenants lines blanked.
	rest []byte
	// entries are the byte offsets at which each entry starts, then the
	// end of the block.
	entries []int
	// lines are the 0-based line numbers of entries.
	lines []int
}

// findTenantBlock locates the block-style tenants mapping of data. ok is
// false when data has none (then rest is data) or has one this reader does
// not split (then tenants are read with the whole document).
func findTenantBlock(data []byte) (b tenantBlock, found, ok bool) {
	header, start, end := -1, -1, len(data)
	headerLine := 0
	line := 0
	for pos := 0; pos < len(data); line++ {
		eol := bytes.IndexByte(data[pos:], '\n')
		next := len(data)
		if eol >= 0 {
			next = pos + eol + 1
		}
		text := data[pos:next]
		switch {
		case header < 0:
			if bytes.HasPrefix(text, []byte("tenants:")) {
				tail := strings.TrimSpace(string(text[len("tenants:"):]))
				if tail != "" && !strings.HasPrefix(tail, "#") {
					return tenantBlock{rest: data}, true, false // tenants: {...} on one line
				}
				header, start, headerLine = pos, next, line
			}
		case end == len(data) && start >= 0:
			if len(text) > 0 && text[0] != ' ' && text[0] != '#' && text[0] != '\n' && text[0] != '\r' {
				end = pos
				if bytes.HasPrefix(text, []byte("tenants:")) {
					return tenantBlock{rest: data}, true, false // a second tenants key: the whole reader reports it
				}
			}
		default:
			if bytes.HasPrefix(text, []byte("tenants:")) {
				return tenantBlock{rest: data}, true, false
			}
		}
		pos = next
	}
	if header < 0 {
		return tenantBlock{rest: data}, false, true
	}
	// Entries start at the indentation of the first line with content.
	indent := -1
	line = headerLine + 1
	for pos := start; pos < end; line++ {
		eol := bytes.IndexByte(data[pos:end], '\n')
		next := end
		if eol >= 0 {
			next = pos + eol + 1
		}
		text := data[pos:next]
		n := 0
		for n < len(text) && text[n] == ' ' {
			n++
		}
		content := bytes.TrimRight(text[n:], "\r\n")
		if len(content) > 0 && content[0] != '#' {
			switch {
			case indent < 0:
				if content[0] == '-' || content[0] == '\t' || n == 0 {
					return tenantBlock{rest: data}, true, false
				}
				indent = n
				fallthrough
			case n == indent:
				b.entries = append(b.entries, pos)
				b.lines = append(b.lines, line)
			case n < indent:
				return tenantBlock{rest: data}, true, false
			}
		}
		pos = next
	}
	b.entries = append(b.entries, end)
	// The rest keeps every line break, so its line numbers are the
	// document's.
	rest := make([]byte, 0, len(data)-(end-header)+bytes.Count(data[header:end], []byte("\n")))
	rest = append(rest, data[:header]...)
	for _, c := range data[header:end] {
		if c == '\n' {
			rest = append(rest, '\n')
		}
	}
	b.rest = append(rest, data[end:]...)
	return b, true, true
}

// readTenantBlock decodes the entries of b. ok is false when an entry does
// not parse on its own (an alias to an anchor elsewhere, a syntax error):
// the caller then reads the document whole, which reports any error with
// its context. Decoding problems are returned as decoder messages.
func readTenantBlock(ctx context.Context, data []byte, b tenantBlock) (tenants map[string]Tenant, msgs []string, ok bool, err error) {
	n := len(b.entries) - 1
	if n > MaxTenants {
		return nil, nil, true, &LimitError{Limit: "config.MaxTenants", Max: MaxTenants, Got: int64(n), What: "tenants"}
	}
	if n == 0 {
		return nil, nil, true, nil
	}
	tenants = make(map[string]Tenant, n)
	lineOf := make(map[string]int, n)
	for i := 0; i < n; i += tenantBatch {
		if err := canceled(ctx); err != nil {
			return nil, nil, true, err
		}
		j := min(i+tenantBatch, n)
		var doc yaml.Node
		if err := yaml.Unmarshal(data[b.entries[i]:b.entries[j]], &doc); err != nil {
			return nil, nil, false, nil
		}
		if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
			return nil, nil, false, nil
		}
		shiftLines(&doc, b.lines[i])
		if !decodeTenantPairs(doc.Content[0], tenants, lineOf, &msgs) {
			return nil, nil, false, nil
		}
	}
	return tenants, msgs, true, nil
}

// shiftLines adds off to the line of every node under n.
func shiftLines(n *yaml.Node, off int) {
	n.Line += off
	for _, c := range n.Content {
		shiftLines(c, off)
	}
}

// decodeTenantPairs decodes the pairs of a tenants mapping into tenants,
// recording problems in msgs. It is false when a key is not a plain
// scalar (the whole-document reader handles such documents).
func decodeTenantPairs(m *yaml.Node, tenants map[string]Tenant, lineOf map[string]int, msgs *[]string) bool {
	for k := 0; k+1 < len(m.Content); k += 2 {
		key, value := m.Content[k], m.Content[k+1]
		if key.Kind != yaml.ScalarNode || key.Value == "<<" {
			return false
		}
		if len(tenants) >= MaxTenants {
			*msgs = append(*msgs, (&LimitError{Limit: "config.MaxTenants", Max: MaxTenants, What: "tenants"}).Error())
			return true
		}
		if first, dup := lineOf[key.Value]; dup {
			*msgs = append(*msgs, fmt.Sprintf("line %d: mapping key %q already defined at line %d", key.Line, key.Value, first))
			continue
		}
		lineOf[key.Value] = key.Line
		tenants[key.Value] = decodeTenant(value, msgs)
	}
	return true
}

// decodeTenant decodes one tenant's node strictly: unknown and repeated
// fields are problems, as the YAML decoder reports them.
func decodeTenant(n *yaml.Node, msgs *[]string) Tenant {
	var t Tenant
	fields, ok := mappingPairs(n, "config.Tenant", msgs)
	if !ok {
		return t
	}
	for _, f := range fields {
		switch f.key.Value {
		case "tier":
			decodeInto(f.value, &t.Tier, msgs)
		case "shadow":
			decodeInto(f.value, &t.Shadow, msgs)
		case "overrides":
			classes, ok := mappingPairs(f.value, "map[string]config.LimitSpec", msgs)
			if !ok || len(classes) == 0 {
				continue
			}
			t.Overrides = make(map[string]LimitSpec, len(classes))
			for _, c := range classes {
				t.Overrides[c.key.Value] = decodeLimit(c.value, msgs)
			}
		default:
			*msgs = append(*msgs, fmt.Sprintf("line %d: field %s not found in type config.Tenant", f.key.Line, f.key.Value))
		}
	}
	return t
}

func decodeLimit(n *yaml.Node, msgs *[]string) LimitSpec {
	var l LimitSpec
	fields, ok := mappingPairs(n, "config.LimitSpec", msgs)
	if !ok {
		return l
	}
	for _, f := range fields {
		switch f.key.Value {
		case "rate":
			decodeInto(f.value, &l.Rate, msgs)
		case "burst":
			decodeInto(f.value, &l.Burst, msgs)
		default:
			*msgs = append(*msgs, fmt.Sprintf("line %d: field %s not found in type config.LimitSpec", f.key.Line, f.key.Value))
		}
	}
	return l
}

// decodeInto decodes a scalar field, keeping the decoder's messages.
func decodeInto(n *yaml.Node, v any, msgs *[]string) {
	err := n.Decode(v)
	var te *yaml.TypeError
	switch {
	case err == nil:
	case errors.As(err, &te):
		*msgs = append(*msgs, te.Errors...)
	default:
		*msgs = append(*msgs, fmt.Sprintf("line %d: %v", n.Line, err))
	}
}

type pair struct{ key, value *yaml.Node }

// mappingPairs lists the pairs of a mapping node, following aliases and
// merge keys ("<<", whose fields the mapping's own override). A null is
// no pairs; another kind of node, a key that is not a scalar or a repeated
// key is a problem.
func mappingPairs(n *yaml.Node, goType string, msgs *[]string) ([]pair, bool) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return nil, true
	}
	if n.Kind != yaml.MappingNode {
		tag := strings.TrimPrefix(n.ShortTag(), "!!")
		if n.Kind == yaml.ScalarNode {
			*msgs = append(*msgs, fmt.Sprintf("line %d: cannot unmarshal !!%s `%s` into %s", n.Line, tag, n.Value, goType))
		} else {
			*msgs = append(*msgs, fmt.Sprintf("line %d: cannot unmarshal !!%s into %s", n.Line, tag, goType))
		}
		return nil, false
	}
	var merged, own []pair
	seen := make(map[string]int, len(n.Content)/2)
	for k := 0; k+1 < len(n.Content); k += 2 {
		key, value := n.Content[k], n.Content[k+1]
		if key.Kind == yaml.ScalarNode && key.Value == "<<" && key.ShortTag() == "!!merge" {
			sources := []*yaml.Node{value}
			if value.Kind == yaml.SequenceNode {
				sources = value.Content
			}
			for _, src := range sources {
				inner, ok := mappingPairs(src, goType, msgs)
				if !ok {
					return nil, false
				}
				merged = append(merged, inner...)
			}
			continue
		}
		if key.Kind != yaml.ScalarNode {
			*msgs = append(*msgs, fmt.Sprintf("line %d: a key here must be a plain name", key.Line))
			continue
		}
		if first, dup := seen[key.Value]; dup {
			*msgs = append(*msgs, fmt.Sprintf("line %d: mapping key %q already defined at line %d", key.Line, key.Value, first))
			continue
		}
		seen[key.Value] = key.Line
		own = append(own, pair{key, value})
	}
	out := own
	for _, p := range merged {
		if _, mine := seen[p.key.Value]; !mine {
			seen[p.key.Value] = p.key.Line
			out = append(out, p)
		}
	}
	return out, true
}

// countInlineTenants is the number of entries of the top-level tenants
// mapping of a document read whole.
func countInlineTenants(root *yaml.Node) int {
	doc := root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		doc = doc.Content[0]
	}
	t := mappingValue(doc, "tenants")
	if t == nil || t.Kind != yaml.MappingNode {
		return 0
	}
	return len(t.Content) / 2
}

// ParseTenant reads one tenant's YAML (or JSON) strictly, as it is stored
// on its own (package configstore keeps one etcd key per tenant). It does
// not validate it against a config: see Config.TenantProblems.
func ParseTenant(data []byte) (Tenant, error) {
	if t, ok := parseTenantJSON(data); ok {
		return t, nil
	}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return Tenant{}, fmt.Errorf("%w: the tenant is empty", ErrInvalidConfig)
		}
		return Tenant{}, yamlProblems(err)
	}
	if len(doc.Content) != 1 {
		return Tenant{}, fmt.Errorf("%w: the tenant is empty", ErrInvalidConfig)
	}
	var msgs []string
	t := decodeTenant(doc.Content[0], &msgs)
	if len(msgs) > 0 {
		return Tenant{}, yamlProblems(&yaml.TypeError{Errors: msgs})
	}
	return t, nil
}

// MarshalTenant writes one tenant as compact JSON (which is also YAML),
// the form package configstore stores: fields tier, overrides (class to
// {rate, burst}, the rate written as in YAML, "800/s") and shadow, the
// last two left out when empty.
func MarshalTenant(t Tenant) ([]byte, error) {
	out := jsonTenant{Tier: t.Tier, Shadow: t.Shadow}
	if len(t.Overrides) > 0 {
		out.Overrides = make(map[string]jsonLimit, len(t.Overrides))
		for class, l := range t.Overrides {
			if math.IsInf(float64(l.Rate), 0) || math.IsNaN(float64(l.Rate)) || math.IsInf(l.Burst, 0) || math.IsNaN(l.Burst) {
				return nil, fmt.Errorf("config: tenant override %s: rate %v or burst %v is not finite", class, float64(l.Rate), l.Burst)
			}
			out.Overrides[class] = jsonLimit{Rate: l.Rate.String(), Burst: l.Burst}
		}
	}
	return json.Marshal(out)
}

type jsonTenant struct {
	Tier      string               `json:"tier"`
	Overrides map[string]jsonLimit `json:"overrides,omitempty"`
	Shadow    bool                 `json:"shadow,omitempty"`
}

type jsonLimit struct {
	Rate  string  `json:"rate"`
	Burst float64 `json:"burst"`
}

// parseTenantJSON reads MarshalTenant's form quickly; ok is false for
// anything else, which ParseTenant then reads as YAML.
func parseTenantJSON(data []byte) (Tenant, bool) {
	if len(data) == 0 || data[0] != '{' {
		return Tenant{}, false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var in jsonTenant
	if dec.Decode(&in) != nil || dec.More() {
		return Tenant{}, false
	}
	t := Tenant{Tier: in.Tier, Shadow: in.Shadow}
	if len(in.Overrides) > 0 {
		t.Overrides = make(map[string]LimitSpec, len(in.Overrides))
		for class, l := range in.Overrides {
			r, err := ParseRate(l.Rate)
			if err != nil {
				return Tenant{}, false
			}
			t.Overrides[class] = LimitSpec{Rate: r, Burst: l.Burst}
		}
	}
	return t, true
}

// TenantEqual says whether a and b say the same.
func TenantEqual(a, b Tenant) bool {
	if a.Tier != b.Tier || a.Shadow != b.Shadow || len(a.Overrides) != len(b.Overrides) {
		return false
	}
	for class, l := range a.Overrides {
		if m, ok := b.Overrides[class]; !ok || m != l {
			return false
		}
	}
	return true
}
