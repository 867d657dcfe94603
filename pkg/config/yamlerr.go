package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"
)

// yamlProblems turns a YAML decoding error into one error per problem, each
// wrapping ErrInvalidConfig and worded for the person editing the file: the
// decoder's messages name Go types ("field epochh not found in type
// config.Config"), which mean nothing to them.
func yamlProblems(err error) error {
	msgs := YAMLMessages(err)
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		// A syntax error: one message, with the line when the decoder
		// knows it (not at an unexpected end of the document).
		return &yamlError{msgs[0]}
	}
	var out []error
	for i, m := range msgs {
		if i == MaxProblems {
			out = append(out, &MoreProblems{N: len(msgs) - MaxProblems})
			break
		}
		out = append(out, &yamlError{m})
	}
	return errors.Join(out...)
}

// YAMLMessages words a YAML decoding error for the person editing the
// file, one message per problem ("unknown field \"epochh\" (line 3)",
// "\"x\" is not a whole number (line 7)"), where the decoder names Go
// types. Other documents' parsers (the simulator's scenarios) use it too.
func YAMLMessages(err error) []string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return []string{yamlMessage(strings.TrimPrefix(err.Error(), "yaml: "))}
	}
	out := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		out[i] = yamlMessage(m)
	}
	return out
}

// yamlError is one problem found while decoding, before any field could be
// validated. It wraps ErrInvalidConfig.
type yamlError struct{ msg string }

func (e *yamlError) Error() string { return e.msg }

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *yamlError) Unwrap() error { return ErrInvalidConfig }

var (
	// (?s): a value the decoder quotes may span lines (a plain scalar
	// folded over several), and its message with it.
	unknownFieldRE = regexp.MustCompile(`(?s)^line (\d+): field (.+) not found in type \S+$`)
	unmarshalRE    = regexp.MustCompile("(?s)^line (\\d+): cannot unmarshal !!(\\w+)(?: `(.*)`)? into (.+)$")
	lineRE         = regexp.MustCompile(`(?s)^line (\d+): (.+)$`)
)

// yamlMessage rewrites one of the decoder's messages into "what is wrong
// (line N)"; those that name no Go type (Rate's, Duration's) keep their words.
func yamlMessage(m string) string {
	if g := unknownFieldRE.FindStringSubmatch(m); g != nil {
		return fmt.Sprintf("unknown field %q (line %s)", g[2], g[1])
	}
	if g := unmarshalRE.FindStringSubmatch(m); g != nil {
		got := yamlKind(g[2])
		if g[3] != "" {
			got = fmt.Sprintf("%q", g[3])
		}
		return fmt.Sprintf("%s is not %s (line %s)", got, goTypeName(g[4]), g[1])
	}
	if g := lineRE.FindStringSubmatch(m); g != nil {
		return fmt.Sprintf("%s (line %s)", g[2], g[1])
	}
	return m
}

// yamlKind names a YAML tag's kind of node.
func yamlKind(tag string) string {
	switch tag {
	case "map":
		return "a mapping"
	case "seq":
		return "a list"
	case "null":
		return "an empty value"
	}
	return "a " + tag
}

// goTypeName says what a Go type accepts, in YAML words.
func goTypeName(t string) string {
	switch {
	case strings.HasPrefix(t, "map["), t == "config.Config", t == "config.Region", t == "config.Class",
		t == "config.LimitSpec", t == "config.Tenant", t == "config.Envoy", t == "config.EnvoyDescriptor",
		t == "config.EnvoyDomain", t == "config.EnvoyNode":
		return "a mapping"
	case strings.HasPrefix(t, "config."):
		return "a string"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case t == "bool":
		return "true or false"
	case t == "string":
		return "a string"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.HasPrefix(t, "uint"):
		return "a whole number, 0 or more"
	case strings.HasPrefix(t, "int"):
		return "a whole number"
	}
	return "valid here"
}
