package envoyrls_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/quota"
)

// tupleOf reads a tuple of values from b: each value is a length byte and
// that many bytes (fewer at the end of b).
func tupleOf(b []byte) []string {
	var out []string
	for len(b) > 0 {
		n := min(int(b[0]), len(b)-1)
		out = append(out, string(b[1:1+n]))
		b = b[1+n:]
	}
	return out
}

// encodeTuple is tupleOf's inverse, for seeds (values under 256 bytes).
func encodeTuple(values ...string) []byte {
	var b []byte
	for _, v := range values {
		b = append(b, byte(len(v)))
		b = append(b, v...)
	}
	return b
}

// tenantSeeds are pairs of tuples a join or an unprefixed digest would
// run together, and the values Envoy sends. testdata/fuzz/FuzzTenant
// holds the same.
func tenantSeeds() [][2][]byte {
	pairs := [][2][]string{
		{{"p:q", "r"}, {"p", "q:r"}},
		{{"ab", "c"}, {"a", "bc"}},
		{{"a", ""}, {"a:"}},
		{{}, {"_"}},
		{{""}, {"", ""}},
		{{strings.Repeat("a", 128)}, {strings.Repeat("a", 129)}},
		{{strings.Repeat("a", 64), strings.Repeat("b", 63)}, {strings.Repeat("a", 64), strings.Repeat("b", 64)}},
		{{"\x01a"}, {"", "a"}},
	}
	for _, v := range sentValues {
		pairs = append(pairs, [2][]string{{v}, {"x", v}})
	}
	var out [][2][]byte
	for _, p := range pairs {
		out = append(out, [2][]byte{encodeTuple(p[0]...), encodeTuple(p[1]...)})
	}
	return out
}

// FuzzTenant: every tuple of values has a valid tenant; a plain tenant
// splits at ':' into its tuple again, so no other tuple has it; a digest
// is one only a tuple that cannot be plain gets; two distinct tuples never
// share a tenant. MappingTenant keeps every valid value not of a digest's
// form and gives any other its digest.
func FuzzTenant(f *testing.F) {
	for _, s := range tenantSeeds() {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ta, tb := tupleOf(a), tupleOf(b)
		tenant := envoyrls.TreeTenant(ta...)
		if err := (quota.Key{Tenant: tenant, Class: "c"}).Validate(); err != nil {
			t.Fatalf("TreeTenant(%q) = %q: %v", ta, tenant, err)
		}
		switch {
		case len(ta) == 0:
			if tenant != "_" {
				t.Fatalf("TreeTenant() = %q, want _", tenant)
			}
		case envoyrls.IsDigest(tenant):
			if tenant != envoyrls.Digest(ta...) {
				t.Fatalf("TreeTenant(%q) = %q, not its digest", ta, tenant)
			}
		case tenant == "_" || !slices.Equal(strings.Split(tenant, ":"), ta):
			t.Fatalf("TreeTenant(%q) = %q: a plain tenant that is not the tuple's join", ta, tenant)
		}
		if other := envoyrls.TreeTenant(tb...); (other == tenant) != slices.Equal(ta, tb) {
			t.Fatalf("TreeTenant(%q) = %q, TreeTenant(%q) = %q", ta, tenant, tb, other)
		}

		v := string(a)
		m := envoyrls.MappingTenant(v)
		if err := (quota.Key{Tenant: m, Class: "c"}).Validate(); err != nil {
			t.Fatalf("MappingTenant(%q) = %q: %v", v, m, err)
		}
		keeps := quota.ValidateID("tenant", v) == nil && !envoyrls.IsDigest(v)
		if keeps && m != v || !keeps && m != envoyrls.Digest(v) {
			t.Fatalf("MappingTenant(%q) = %q", v, m)
		}
		if w := string(b); (envoyrls.MappingTenant(w) == m) != (w == v) {
			t.Fatalf("MappingTenant(%q) = %q, MappingTenant(%q) = %q", v, m, w, envoyrls.MappingTenant(w))
		}
	})
}
