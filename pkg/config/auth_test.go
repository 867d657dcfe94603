package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestAuthIdentitiesParseAndGiveRoles(t *testing.T) {
	data := append(SampleYAML(), []byte(`
auth:
  identities:
    - match: spiffe://sluice.example/region/us-east
      roles: instance, region:us-east
    - match: spiffe://sluice.example/app/*
      roles: instance
    - match: ops.sluice.example
      roles: operator,envoy
`)...)
	c, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sans []string
		want []string
	}{
		{[]string{"spiffe://sluice.example/region/us-east"}, []string{"instance", "region:us-east"}},
		{[]string{"spiffe://sluice.example/app/checkout"}, []string{"instance"}},
		{[]string{"spiffe://sluice.example/app"}, nil},
		{[]string{"x.example", "ops.sluice.example"}, []string{"envoy", "operator"}},
		{[]string{"spiffe://sluice.example/region/us-east", "spiffe://sluice.example/app/a"}, []string{"instance", "region:us-east"}},
		{nil, nil},
	} {
		if got := c.Auth.RolesOf(tc.sans); !slices.Equal(got, tc.want) {
			t.Errorf("RolesOf(%q) = %q, want %q", tc.sans, got, tc.want)
		}
	}
	again, err := Parse(mustMarshal(t, c))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.Auth.Identities, c.Auth.Identities) {
		t.Errorf("round trip changed auth: %v", again.Auth.Identities)
	}
}

func mustMarshal(t *testing.T, c *Config) []byte {
	t.Helper()
	out, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestAuthIdentitiesRefusedNamingTheField(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"- {match: '', roles: instance}", "auth.identities[0].match: is required"},
		{"- {match: '*', roles: instance}", "auth.identities[0].match: a lone *"},
		{"- {match: 'a*b', roles: instance}", "* may only end a pattern"},
		{"- {match: 'a b', roles: instance}", "space or control character"},
		{"- {match: a, roles: ' , '}", "auth.identities[0].roles: lists no role"},
		{"- {match: a, roles: admin}", `unknown role "admin"`},
		{"- {match: a, roles: 'region:mars'}", `names region "mars", which is not under regions`},
		{"- {match: a, roles: instance}\n    - {match: a, roles: envoy}", `auth.identities[1].match: "a" is also auth.identities[0]'s`},
	} {
		data := append(SampleYAML(), []byte("\nauth:\n  identities:\n    "+tc.yaml+"\n")...)
		_, err := Parse(data)
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an invalid config saying %q", tc.yaml, err, tc.want)
		}
	}
}
