// Package structfield parses HTTP structured-field Lists (RFC 8941), so
// tests can read the IETF RateLimit and RateLimit-Policy fields (and the
// list form of x-ratelimit-limit) the way a conforming client does, rather
// than by matching strings. It implements RFC 8941 §4.2 for Lists: Items,
// Inner Lists, Parameters and every bare item type; a value that is not a
// valid List is an error naming the offset.
package structfield

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

// Kind is a bare item's type.
type Kind int

const (
	Integer Kind = iota + 1
	Decimal
	String
	Token
	ByteSequence
	Boolean
)

func (k Kind) String() string {
	return [...]string{"?", "Integer", "Decimal", "String", "Token", "Byte Sequence", "Boolean"}[k]
}

// Bare is one bare item.
type Bare struct {
	Kind  Kind
	Int   int64
	Dec   float64
	Str   string // String and Token
	Bytes []byte
	Bool  bool
}

// Param is one parameter, in order.
type Param struct {
	Key   string
	Value Bare
}

// Member is one List member: an Item, or an Inner List when Inner is set.
type Member struct {
	Item   Bare
	Inner  []Member // items of an Inner List (their Inner is nil)
	IsList bool
	Params []Param
}

// Param returns the value of key, if present (the last one wins, RFC
// 8941 §4.2.3.2).
func (m Member) Param(key string) (Bare, bool) {
	for i := len(m.Params) - 1; i >= 0; i-- {
		if m.Params[i].Key == key {
			return m.Params[i].Value, true
		}
	}
	return Bare{}, false
}

// ParseList parses a field value as a structured-field List. Several field
// lines are joined with ", " before parsing, as RFC 8941 §4.2 says.
func ParseList(lines ...string) ([]Member, error) {
	p := &parser{s: strings.Trim(strings.Join(lines, ", "), " ")}
	var out []Member
	for p.i < len(p.s) {
		m, err := p.member()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
		p.ows()
		if p.i == len(p.s) {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, p.errf("want ',' between members")
		}
		p.i++
		p.ows()
		if p.i == len(p.s) {
			return nil, p.errf("trailing ','")
		}
	}
	return out, nil
}

type parser struct {
	s string
	i int
}

func (p *parser) errf(format string, args ...any) error {
	return fmt.Errorf("structured field %q, offset %d: %s", p.s, p.i, fmt.Sprintf(format, args...))
}

func (p *parser) ows() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *parser) sp() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *parser) member() (Member, error) {
	if p.i < len(p.s) && p.s[p.i] == '(' {
		return p.innerList()
	}
	b, err := p.bare()
	if err != nil {
		return Member{}, err
	}
	params, err := p.params()
	return Member{Item: b, Params: params}, err
}

func (p *parser) innerList() (Member, error) {
	p.i++ // (
	m := Member{IsList: true}
	for {
		p.sp()
		if p.i >= len(p.s) {
			return Member{}, p.errf("unterminated inner list")
		}
		if p.s[p.i] == ')' {
			p.i++
			params, err := p.params()
			m.Params = params
			return m, err
		}
		b, err := p.bare()
		if err != nil {
			return Member{}, err
		}
		params, err := p.params()
		if err != nil {
			return Member{}, err
		}
		m.Inner = append(m.Inner, Member{Item: b, Params: params})
		if p.i < len(p.s) && p.s[p.i] != ' ' && p.s[p.i] != ')' {
			return Member{}, p.errf("want a space or ')' after an inner-list item")
		}
	}
}

func (p *parser) params() ([]Param, error) {
	var out []Param
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.sp()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		v := Bare{Kind: Boolean, Bool: true}
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if v, err = p.bare(); err != nil {
				return nil, err
			}
		}
		out = append(out, Param{Key: key, Value: v})
	}
	return out, nil
}

func (p *parser) key() (string, error) {
	start := p.i
	if p.i >= len(p.s) || !(isLower(p.s[p.i]) || p.s[p.i] == '*') {
		return "", p.errf("a key starts with a lowercase letter or '*'")
	}
	for p.i < len(p.s) && (isLower(p.s[p.i]) || isDigit(p.s[p.i]) || strings.IndexByte("_-.*", p.s[p.i]) >= 0) {
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *parser) bare() (Bare, error) {
	if p.i >= len(p.s) {
		return Bare{}, p.errf("want an item, found the end")
	}
	c := p.s[p.i]
	switch {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == ':':
		return p.bytes()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			b := Bare{Kind: Boolean, Bool: p.s[p.i+1] == '1'}
			p.i += 2
			return b, nil
		}
		return Bare{}, p.errf("a boolean is ?0 or ?1")
	case isAlpha(c) || c == '*':
		start := p.i
		p.i++
		for p.i < len(p.s) && (isTchar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return Bare{Kind: Token, Str: p.s[start:p.i]}, nil
	}
	return Bare{}, p.errf("%q starts no item", c)
}

// number follows RFC 8941 §4.2.4: at most 15 integer digits, a decimal at
// most 12 before and 3 after the point.
func (p *parser) number() (Bare, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits, dot := 0, -1
	for p.i < len(p.s) {
		c := p.s[p.i]
		if isDigit(c) {
			digits++
		} else if c == '.' && dot < 0 {
			if digits > 12 {
				return Bare{}, p.errf("more than 12 digits before a decimal point")
			}
			dot = digits
		} else {
			break
		}
		p.i++
	}
	text := p.s[start:p.i]
	if digits == 0 {
		return Bare{}, p.errf("a number needs digits")
	}
	if dot < 0 {
		if digits > 15 {
			return Bare{}, p.errf("an integer has at most 15 digits")
		}
		n, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return Bare{}, p.errf("%v", err)
		}
		return Bare{Kind: Integer, Int: n}, nil
	}
	if frac := digits - dot; frac == 0 || frac > 3 {
		return Bare{}, p.errf("a decimal has 1 to 3 digits after the point")
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return Bare{}, p.errf("%v", err)
	}
	return Bare{Kind: Decimal, Dec: f}, nil
}

func (p *parser) str() (Bare, error) {
	p.i++ // "
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return Bare{}, p.errf("only \\\" and \\\\ are escapes in a string")
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return Bare{Kind: String, Str: b.String()}, nil
		case c < 0x20 || c > 0x7e:
			return Bare{}, p.errf("byte %#x in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return Bare{}, p.errf("unterminated string")
}

func (p *parser) bytes() (Bare, error) {
	p.i++ // :
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return Bare{}, p.errf("unterminated byte sequence")
	}
	raw := p.s[p.i : p.i+end]
	p.i += end + 1
	b, err := base64.StdEncoding.DecodeString(raw)
	if err != nil {
		return Bare{}, p.errf("byte sequence: %v", err)
	}
	return Bare{Kind: ByteSequence, Bytes: b}, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool { return isLower(c) || (c >= 'A' && c <= 'Z') }

// isTchar is RFC 9110's tchar.
func isTchar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
