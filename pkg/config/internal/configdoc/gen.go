package main

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The list items a field's doc comment ends with ("  - Key: value").
// Exactly one of Required and Default; Rule and Example on every scalar;
// Unit on every bare number; Key on every map.
const (
	itemRequired = "Required"
	itemDefault  = "Default"
	itemUnit     = "Unit"
	itemRule     = "Rule"
	itemExample  = "Example"
	itemKey      = "Key"
)

var knownItems = []string{itemRequired, itemDefault, itemUnit, itemRule, itemExample, itemKey}

// scalarTypes describes the scalar types of the schema: how the reference
// names them and their unit when the type says it.
var scalarTypes = map[string]struct{ name, unit string }{
	"Duration": {"duration", "Go duration: `250ms`, `1s`, `1m30s`, `1h`"},
	"Rate":     {"rate", "tokens per second, written `10/s`, `6/m`, `1000/h`, `5/d`, or a bare number meaning per second"},
	"float64":  {"number", ""},
	"int64":    {"integer", ""},
	"bool":     {"boolean", "—"},
	"string":   {"string", "—"},
}

// field is one documented config field.
type field struct {
	path     string // regions.<region>.weight
	goName   string // Region.Weight
	section  string // the path of the mapping that holds it ("" for the top level)
	typ      string
	unit     string
	required bool
	def      string
	rule     string
	key      string // for maps: the key's placeholder
	desc     string
	example  string // the value of the example
	// exampleCtx is the example's path from the root: mapping keys (each
	// map's example key for its placeholder) and "-" for a list item.
	exampleCtx []string
	values     []enumValue
}

type enumValue struct{ value, doc string }

type typeDecl struct {
	expr ast.Expr
	doc  string
}

type schema struct {
	types map[string]typeDecl
	enums map[string][]enumValue
}

// Generate reads package config in dir and returns docs/config.md, or an
// error listing every field whose documentation is incomplete.
func Generate(dir string) ([]byte, error) {
	s, err := load(dir)
	if err != nil {
		return nil, err
	}
	sample, err := os.ReadFile(filepath.Join(dir, "sample.yaml"))
	if err != nil {
		return nil, err
	}
	w := walker{s: s}
	w.walkStruct("Config", "", nil)
	if len(w.errs) > 0 {
		return nil, errors.Join(w.errs...)
	}
	return render(w.fields, sample), nil
}

func load(dir string) (*schema, error) {
	fset := token.NewFileSet()
	matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	s := &schema{types: map[string]typeDecl{}, enums: map[string][]enumValue{}}
	for _, path := range matches {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok {
				continue
			}
			for _, spec := range gd.Specs {
				switch sp := spec.(type) {
				case *ast.TypeSpec:
					doc := sp.Doc
					if doc == nil && len(gd.Specs) == 1 {
						doc = gd.Doc
					}
					s.types[sp.Name.Name] = typeDecl{expr: sp.Type, doc: doc.Text()}
				case *ast.ValueSpec:
					typ, ok := sp.Type.(*ast.Ident)
					if gd.Tok != token.CONST || !ok || len(sp.Values) != 1 || len(sp.Names) != 1 {
						continue
					}
					lit, ok := sp.Values[0].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						return nil, err
					}
					doc := strings.Join(strings.Fields(sp.Doc.Text()), " ")
					doc = strings.TrimPrefix(doc, sp.Names[0].Name+" ")
					s.enums[typ.Name] = append(s.enums[typ.Name], enumValue{value: v, doc: doc})
				}
			}
		}
	}
	if _, ok := s.types["Config"]; !ok {
		return nil, fmt.Errorf("no type Config in %s", dir)
	}
	return s, nil
}

// walker collects the fields reachable from Config, in declaration order,
// and every documentation problem.
type walker struct {
	s      *schema
	fields []field
	errs   []error
	// walking maps each struct type being walked to its path, so a
	// recursive type (EnvoyNode) is documented once and referred to.
	walking map[string]string
}

func (w *walker) errorf(format string, args ...any) {
	w.errs = append(w.errs, fmt.Errorf(format, args...))
}

func (w *walker) walkStruct(name, prefix string, ctx []string) {
	decl, ok := w.s.types[name]
	st, isStruct := decl.expr.(*ast.StructType)
	if !ok || !isStruct {
		w.errorf("%s is not a struct type of package config", name)
		return
	}
	if w.walking == nil {
		w.walking = map[string]string{}
	}
	w.walking[name] = prefix
	defer delete(w.walking, name)
	for _, f := range st.Fields.List {
		if len(f.Names) != 1 {
			w.errorf("%s: embedded or grouped fields are not supported by the reference", name)
			continue
		}
		goName := name + "." + f.Names[0].Name
		if !f.Names[0].IsExported() {
			continue
		}
		yamlName := ""
		if f.Tag != nil {
			tag, _ := strconv.Unquote(f.Tag.Value)
			yamlName, _, _ = strings.Cut(reflect.StructTag(tag).Get("yaml"), ",")
		}
		if yamlName == "" || yamlName == "-" {
			w.errorf("%s: no yaml name in its struct tag", goName)
			continue
		}
		w.field(goName, prefix, ctx, yamlName, f)
	}
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

func (w *walker) field(goName, prefix string, ctx []string, yamlName string, f *ast.Field) {
	path := join(prefix, yamlName)
	fd := field{path: path, goName: goName, section: prefix}
	items, desc, err := parseDoc(f.Doc.Text())
	if err != nil {
		w.errorf("%s (%s): %v", path, goName, err)
		return
	}
	if desc == "" {
		w.errorf("%s (%s): no description: the doc comment must say what the field is", path, goName)
	}
	bare := goName[strings.Index(goName, ".")+1:]
	if rest, ok := strings.CutPrefix(desc, bare+" "); ok {
		desc = "`" + yamlName + "` " + rest
	}
	fd.desc = desc
	_, fd.required = items[itemRequired]
	def, hasDefault := items[itemDefault]
	switch {
	case fd.required && hasDefault:
		w.errorf("%s (%s): says both Required and Default", path, goName)
	case !fd.required && !hasDefault:
		w.errorf("%s (%s): says neither Required nor Default: every field is required or optional with a default", path, goName)
	}
	if items[itemRequired] != "" {
		w.errorf("%s (%s): Required takes no value", path, goName)
	}
	fd.def, fd.rule, fd.unit, fd.key = def, items[itemRule], items[itemUnit], items[itemKey]
	example := items[itemExample]
	ctx = append(slices.Clone(ctx), yamlName)

	expr := f.Type
	if star, ok := expr.(*ast.StarExpr); ok {
		expr = star.X
	}
	switch t := expr.(type) {
	case *ast.MapType:
		if fd.key == "" {
			w.errorf("%s (%s): a map needs a Key item", path, goName)
			return
		}
		name, ex := parseKey(fd.key)
		fd.typ = "map: `<" + name + ">` → " + w.valueName(t.Value)
		w.fields = append(w.fields, fd)
		w.walkValue(path+".<"+name+">", append(ctx, ex), t.Value)
	case *ast.ArrayType:
		fd.typ = "list of " + w.valueName(t.Elt) + "s"
		if id, ok := t.Elt.(*ast.Ident); ok {
			if at, nested := w.walking[id.Name]; nested {
				fd.typ += ", each with the fields of `" + at + "`"
				w.fields = append(w.fields, fd)
				return
			}
		}
		w.fields = append(w.fields, fd)
		w.walkValue(path+"[]", append(ctx, "-"), t.Elt)
	case *ast.Ident:
		if decl, ok := w.s.types[t.Name]; ok {
			if _, ok := decl.expr.(*ast.StructType); ok {
				fd.typ = "mapping"
				w.fields = append(w.fields, fd)
				w.walkStruct(t.Name, path, ctx)
				return
			}
		}
		fd.exampleCtx = ctx
		w.scalar(&fd, t.Name, example)
		w.fields = append(w.fields, fd)
	default:
		w.errorf("%s (%s): unsupported type %T", path, goName, expr)
	}
}

// walkValue documents the values of a map or list: a struct's fields, or
// for a named map type (Tier) the values of its own map, whose key its
// type's doc names.
func (w *walker) walkValue(path string, ctx []string, expr ast.Expr) {
	id, ok := expr.(*ast.Ident)
	if !ok {
		w.errorf("%s: unsupported element type %T", path, expr)
		return
	}
	decl := w.s.types[id.Name]
	switch t := decl.expr.(type) {
	case *ast.StructType:
		w.walkStruct(id.Name, path, ctx)
	case *ast.MapType:
		items, _, err := parseDoc(decl.doc)
		if err != nil || items[itemKey] == "" {
			w.errorf("type %s: a map type needs a Key item in its doc (%v)", id.Name, err)
			return
		}
		name, ex := parseKey(items[itemKey])
		w.walkValue(path+".<"+name+">", append(slices.Clone(ctx), ex), t.Value)
	default:
		w.errorf("%s: element type %s is neither a struct nor a map", path, id.Name)
	}
}

func (w *walker) scalar(fd *field, typ, example string) {
	base := typ
	if values, ok := w.s.enums[typ]; ok {
		fd.values = values
		names := make([]string, len(values))
		for i, v := range values {
			names[i] = "`" + v.value + "`"
		}
		fd.typ = "one of " + strings.Join(names, ", ")
		if fd.unit == "" {
			fd.unit = "—"
		}
		if fd.rule == "" {
			fd.rule = "one of the values listed"
		}
	} else {
		if decl, ok := w.s.types[typ]; ok {
			if id, ok := decl.expr.(*ast.Ident); ok && typ != "Duration" && typ != "Rate" {
				base = id.Name
			}
		}
		st, ok := scalarTypes[base]
		if !ok {
			w.errorf("%s (%s): unsupported scalar type %s", fd.path, fd.goName, typ)
			return
		}
		fd.typ = st.name
		if fd.unit == "" {
			fd.unit = st.unit
		}
		if base == "bool" && fd.rule == "" {
			fd.rule = "`true` or `false`"
		}
	}
	if fd.unit == "" {
		w.errorf("%s (%s): a bare %s needs a Unit item", fd.path, fd.goName, fd.typ)
	}
	if fd.rule == "" {
		w.errorf("%s (%s): no Rule item", fd.path, fd.goName)
	}
	if example == "" {
		w.errorf("%s (%s): no Example item", fd.path, fd.goName)
		return
	}
	fd.example = example
}

// exampleYAML writes value at the path ctx (mapping keys, "-" for a list
// item) as a YAML document.
func exampleYAML(ctx []string, value string) string {
	var b strings.Builder
	ind, dash := "", false
	for i, k := range ctx {
		if k == "-" {
			dash = true
			continue
		}
		line := ind
		if dash {
			line += "- "
			ind += "  "
			dash = false
		}
		if i == len(ctx)-1 {
			fmt.Fprintf(&b, "%s%s: %s\n", line, k, value)
			break
		}
		fmt.Fprintf(&b, "%s%s:\n", line, k)
		ind += "  "
	}
	return b.String()
}

var keyPattern = regexp.MustCompile(`^([a-z_]+) \(e\.g\. ([A-Za-z0-9._:@-]+)\)$`)

// parseKey reads a Key item, "region (e.g. us-east)".
func parseKey(s string) (name, example string) {
	m := keyPattern.FindStringSubmatch(s)
	if m == nil {
		return s, s
	}
	return m[1], m[2]
}

// valueName names the type of a map's or list's values: a mapping, or for
// a named map type (Tier) a map keyed as its doc's Key item says.
func (w *walker) valueName(e ast.Expr) string {
	id, ok := e.(*ast.Ident)
	if !ok {
		return fmt.Sprintf("%T", e)
	}
	decl := w.s.types[id.Name]
	if m, ok := decl.expr.(*ast.MapType); ok {
		items, _, _ := parseDoc(decl.doc)
		name, _ := parseKey(items[itemKey])
		return "map: `<" + name + ">` → " + w.valueName(m.Value)
	}
	return "mapping"
}

var itemLine = regexp.MustCompile(`^\s+- (.*)$`)

// parseDoc splits a doc comment into its description and its items.
func parseDoc(text string) (map[string]string, string, error) {
	items := map[string]string{}
	var desc []string
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	cur := ""
	for _, line := range lines {
		if m := itemLine.FindStringSubmatch(line); m != nil {
			k, v, _ := strings.Cut(m[1], ":")
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if !slices.Contains(knownItems, k) {
				return nil, "", fmt.Errorf("unknown item %q (known: %s)", k, strings.Join(knownItems, ", "))
			}
			if _, dup := items[k]; dup {
				return nil, "", fmt.Errorf("item %s given twice", k)
			}
			items[k], cur = v, k
			continue
		}
		if cur != "" && strings.HasPrefix(line, "    ") {
			items[cur] += " " + strings.TrimSpace(line)
			continue
		}
		if cur != "" && strings.TrimSpace(line) != "" {
			return nil, "", fmt.Errorf("text after the items: %q (the items end the comment)", line)
		}
		if cur == "" {
			desc = append(desc, line)
		}
	}
	return items, strings.TrimSpace(strings.Join(desc, "\n")), nil
}

const intro = `Every field of Sluice's configuration: its YAML path, type, unit, default,
rule and an example. The configuration is one YAML document, kept in etcd and
hot-reloaded (see [operations.md](operations.md)); ` + "`sluicectl validate -f FILE`" + `
checks a file offline and reports every problem at once, each naming its field
path. Parsing is strict: an unknown field is an error naming it and its line.
Fields left out get their defaults; an explicit zero duration is refused.

In paths, ` + "`<region>`, `<class>`, `<tier>` and `<tenant>`" + ` stand for names you choose
(map keys), and ` + "`[]`" + ` for an item of a list. A key's limit is a token bucket of
` + "`burst`" + ` tokens refilled at ` + "`rate`" + ` for the whole fleet; each region runs on its share
of it.
`

func render(fields []field, sample []byte) []byte {
	var b bytes.Buffer
	b.WriteString("# Configuration reference\n\n")
	b.WriteString("<!-- Code generated by pkg/config/internal/configdoc from the doc comments of pkg/config. DO NOT EDIT. -->\n")
	b.WriteString("<!-- Change the comments in pkg/config and run: go generate ./pkg/config -->\n\n")
	b.WriteString(intro)
	b.WriteString("\n## Summary\n\n| field | type | default | rule |\n|---|---|---|---|\n")
	for _, f := range fields {
		fmt.Fprintf(&b, "| [`%s`](#%s) | %s | %s | %s |\n", f.path, anchor(f.path), cell(f.typ), cell(defaultText(f)), cell(f.rule))
	}
	// Sections in the order they first appear, each field in its section.
	var order []string
	bySection := map[string][]field{}
	for _, f := range fields {
		if _, ok := bySection[f.section]; !ok {
			order = append(order, f.section)
		}
		bySection[f.section] = append(bySection[f.section], f)
	}
	grouped := make([]field, 0, len(fields))
	for _, sec := range order {
		grouped = append(grouped, bySection[sec]...)
	}
	section := "\x00"
	for _, f := range grouped {
		if f.section != section {
			section = f.section
			if section == "" {
				b.WriteString("\n## Top level\n")
			} else {
				fmt.Fprintf(&b, "\n## `%s`\n", section)
			}
		}
		fmt.Fprintf(&b, "\n<a id=\"%s\"></a>\n### `%s`\n\n", anchor(f.path), f.path)
		b.WriteString(f.desc + "\n\n")
		fmt.Fprintf(&b, "- **Type:** %s\n", f.typ)
		if f.unit != "" {
			fmt.Fprintf(&b, "- **Unit:** %s\n", f.unit)
		}
		if f.required {
			b.WriteString("- **Required**\n")
		} else {
			fmt.Fprintf(&b, "- **Optional**, default: %s\n", defaultValue(f.def))
		}
		if f.rule != "" {
			fmt.Fprintf(&b, "- **Rule:** %s\n", f.rule)
		}
		if f.key != "" {
			name, ex := parseKey(f.key)
			fmt.Fprintf(&b, "- **Keys:** `<%s>`, e.g. `%s`\n", name, ex)
		}
		if len(f.values) > 0 {
			b.WriteString("- **Values:**\n")
			for _, v := range f.values {
				fmt.Fprintf(&b, "  - `%s`: %s\n", v.value, v.doc)
			}
		}
		if f.example != "" {
			fmt.Fprintf(&b, "\n```yaml\n%s```\n", exampleYAML(f.exampleCtx, f.example))
		}
	}
	b.WriteString("\n## Complete example\n\nThe built-in sample (`pkg/config/sample.yaml`), what a daemon runs with when it is given no config:\n\n```yaml\n")
	b.Write(bytes.TrimRight(sample, "\n"))
	b.WriteString("\n```\n")
	return b.Bytes()
}

func anchor(path string) string {
	r := strings.NewReplacer(".", "-", "<", "", ">", "", "[]", "")
	return r.Replace(path)
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func defaultText(f field) string {
	if f.required {
		return "required"
	}
	return defaultValue(f.def)
}

// defaultValue puts a one-token default in code quotes.
func defaultValue(s string) string {
	if s != "" && s != "none" && !strings.ContainsAny(s, " ,;") {
		return "`" + s + "`"
	}
	return s
}
