package quota

import (
	"errors"
	"strings"
	"testing"
)

// TestValidateAcceptsExactlyTheNameAlphabet pins the Key invariant the
// Redis key layout relies on: a part is accepted exactly when it is
// 1..max bytes of [A-Za-z0-9._:@-], wherever the offending byte sits, and
// every refusal wraps ErrInvalid. The bytes next to each range's ends are
// tried on both sides.
func TestValidateAcceptsExactlyTheNameAlphabet(t *testing.T) {
	for _, c := range "azAZ09._:@-mQ5" {
		for _, s := range []string{string(c), "x" + string(c), string(c) + "x", "xx" + string(c) + "xx"} {
			if err := (Key{Tenant: s, Class: s}).Validate(); err != nil {
				t.Errorf("Validate(%q, %q) = %v, want accepted", s, s, err)
			}
			if err := ValidateID("instance", s); err != nil {
				t.Errorf("ValidateID(%q) = %v, want accepted", s, err)
			}
		}
	}
	bad := []byte{'`', '{', '}', '|', '[', ']', '/', ' ', '\t', '\n', 0, 0x7f, 0x80, 0xff, '#', '*', '+', ',', ';', '<', '=', '>', '?', '\\', '^', '~', '"', '\''}
	for _, c := range bad {
		for _, s := range []string{string(c), "a" + string(c), string(c) + "a", "ab" + string(c) + "cd", strings.Repeat("a", 50) + string(c)} {
			for _, k := range []Key{{Tenant: s, Class: "read"}, {Tenant: "acme", Class: s}} {
				err := k.Validate()
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("Validate(%q, %q) = %v, want an ErrInvalid", k.Tenant, k.Class, err)
				}
			}
			if err := ValidateID("instance", s); !errors.Is(err, ErrInvalid) {
				t.Errorf("ValidateID(%q) = %v, want an ErrInvalid", s, err)
			}
		}
	}
}

// TestValidateLengths: a part is 1..MaxTenantLen (tenant and ids) or
// 1..MaxClassLen (class) bytes; empty and one byte over are refused.
func TestValidateLengths(t *testing.T) {
	for _, tc := range []struct {
		k  Key
		ok bool
	}{
		{Key{Tenant: "a", Class: "b"}, true},
		{Key{Tenant: strings.Repeat("t", MaxTenantLen), Class: strings.Repeat("c", MaxClassLen)}, true},
		{Key{Tenant: strings.Repeat("t", MaxTenantLen+1), Class: "c"}, false},
		{Key{Tenant: "t", Class: strings.Repeat("c", MaxClassLen+1)}, false},
		{Key{Tenant: "", Class: "c"}, false},
		{Key{Tenant: "t", Class: ""}, false},
		{Key{}, false},
	} {
		err := tc.k.Validate()
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("Validate(len %d, len %d) = %v, want ok=%v", len(tc.k.Tenant), len(tc.k.Class), err, tc.ok)
		}
	}
	if err := ValidateID("region", strings.Repeat("r", MaxTenantLen)); err != nil {
		t.Errorf("ValidateID of %d bytes = %v", MaxTenantLen, err)
	}
	for _, s := range []string{"", strings.Repeat("r", MaxTenantLen+1)} {
		if err := ValidateID("region", s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateID of %d bytes = %v, want an ErrInvalid", len(s), err)
		}
	}
}

// TestValidateCostAndWant: a cost is 1..MaxCost, a want 0..MaxWant; the
// values at and one past each end are judged.
func TestValidateCostAndWant(t *testing.T) {
	for _, tc := range []struct {
		v          int64
		cost, want bool
	}{
		{-1 << 40, false, false},
		{-1, false, false},
		{0, false, true},
		{1, true, true},
		{2, true, true},
		{MaxCost - 1, true, true},
		{MaxCost, true, true},
		{MaxCost + 1, false, true},
		{MaxWant, false, true},
		{MaxWant + 1, false, false},
		{1 << 62, false, false},
	} {
		if err := ValidateCost(tc.v); tc.cost != (err == nil) || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("ValidateCost(%d) = %v, want ok=%v", tc.v, err, tc.cost)
		}
		if err := ValidateWant(tc.v); tc.want != (err == nil) || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("ValidateWant(%d) = %v, want ok=%v", tc.v, err, tc.want)
		}
	}
}

// TestKeyString renders tenant/class, the form logs and errors use.
func TestKeyString(t *testing.T) {
	if got := (Key{Tenant: "acme", Class: "write"}).String(); got != "acme/write" {
		t.Fatalf("String() = %q, want acme/write", got)
	}
}
