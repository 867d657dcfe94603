package quota

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
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

// TestBoundsAreTheDocumented pins the bounds docs/config.md and the wire
// contract state, in numbers rather than through the constants: a tenant
// or id of 128 bytes and a class of 64, a cost of 1..1048576, a want of
// 0..2^30, and bursts and rates up to 1e9 (a burst in micro-tokens and a
// second of refill at the largest rate stay exact in a float64).
func TestBoundsAreTheDocumented(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		accepted bool
	}{
		{"tenant of 128 bytes", Key{Tenant: strings.Repeat("t", 128), Class: "c"}.Validate(), true},
		{"tenant of 129 bytes", Key{Tenant: strings.Repeat("t", 129), Class: "c"}.Validate(), false},
		{"class of 64 bytes", Key{Tenant: "t", Class: strings.Repeat("c", 64)}.Validate(), true},
		{"class of 65 bytes", Key{Tenant: "t", Class: strings.Repeat("c", 65)}.Validate(), false},
		{"id of 128 bytes", ValidateID("region", strings.Repeat("r", 128)), true},
		{"id of 129 bytes", ValidateID("region", strings.Repeat("r", 129)), false},
		{"cost 1048576", ValidateCost(1048576), true},
		{"cost 1048577", ValidateCost(1048577), false},
		{"want 1073741824", ValidateWant(1073741824), true},
		{"want 1073741825", ValidateWant(1073741825), false},
	} {
		if tc.accepted != (tc.err == nil) || (tc.err != nil && !errors.Is(tc.err, ErrInvalid)) {
			t.Errorf("%s: %v, want accepted=%v", tc.name, tc.err, tc.accepted)
		}
	}
	if MinRefresh != 10*time.Millisecond {
		t.Fatalf("MinRefresh = %v, want the 10ms docs/config.md gives refresh", MinRefresh)
	}
	if MaxBurst != 1e9 || MaxRate != 1e9 {
		t.Fatalf("MaxBurst = %d, MaxRate = %d, want 1e9 each", MaxBurst, MaxRate)
	}
	const twoTo53 = 1 << 53
	if float64(MaxBurst)*1e6 >= twoTo53 || float64(MaxRate)*1e6 >= twoTo53 {
		t.Fatalf("%d tokens or %d tokens/s in micro-tokens is not below 2^53", MaxBurst, MaxRate)
	}
}

// TestRefusalsQuoteTheNameCutTo40Bytes: a refused name is quoted whole up
// to 40 bytes and cut to its first 40 bytes and "..." past that, so an
// error line stays short whatever the caller sent.
func TestRefusalsQuoteTheNameCutTo40Bytes(t *testing.T) {
	for _, tc := range []struct {
		name, quoted string
	}{
		{strings.Repeat("a", 39) + "/", `"` + strings.Repeat("a", 39) + `/"`},
		{strings.Repeat("a", 40) + "/", `"` + strings.Repeat("a", 40) + `..."`},
		{"/" + strings.Repeat("a", 40), `"/` + strings.Repeat("a", 39) + `..."`},
	} {
		err := ValidateID("instance", tc.name)
		if err == nil || !strings.Contains(err.Error(), "instance "+tc.quoted+" has byte") {
			t.Errorf("ValidateID(%q) = %v, want it to quote %s", tc.name, err, tc.quoted)
		}
	}
}

// TestRefusalsShowTheByteAtFault: a refused name's byte at fault is shown
// quoted when it is ASCII and in hex otherwise, with the character it
// starts when it starts one (never as the Latin-1 letter of the same
// number: 0xc3 is not 'Ã').
func TestRefusalsShowTheByteAtFault(t *testing.T) {
	for _, tc := range []struct {
		name, says string
	}{
		{"a b", `tenant "a b" has byte ' ' at offset 1; allowed are`},
		{"a{b}", `tenant "a{b}" has byte '{' at offset 1; allowed are`},
		{"acéme", `tenant "acéme" has byte 0xc3 at offset 2 (the first byte of 'é'); allowed are`},
		{"ac\u200bme", `tenant "ac\u200bme" has byte 0xe2 at offset 2 (the first byte of '\u200b'); allowed are`},
		{"a\nb", `tenant "a\nb" has byte '\n' at offset 1; allowed are`},
		{"a\x7fb", `tenant "a\x7fb" has byte '\x7f' at offset 1; allowed are`},
		{"a\x80b", `tenant "a\x80b" has byte 0x80 at offset 1; allowed are`},
		{"a\xffb", `tenant "a\xffb" has byte 0xff at offset 1; allowed are`},
		{"a\xc3", `tenant "a\xc3" has byte 0xc3 at offset 1; allowed are`},
	} {
		err := Key{Tenant: tc.name, Class: "read"}.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("tenant %q: %v; want it to say %s", tc.name, err, tc.says)
		}
	}
}

// TestWholeUnits: a duration rounds up to whole units; an exact unit stays
// itself, nothing left is 0, and the largest Duration does not overflow.
func TestWholeUnits(t *testing.T) {
	for _, c := range []struct {
		d, unit time.Duration
		want    int64
	}{
		{-time.Second, time.Second, 0}, {0, time.Millisecond, 0}, {time.Nanosecond, time.Second, 1},
		{time.Second, time.Second, 1}, {time.Second + time.Nanosecond, time.Second, 2},
		{1500 * time.Microsecond, time.Millisecond, 2}, {3 * time.Millisecond, time.Millisecond, 3},
		{math.MaxInt64, time.Second, math.MaxInt64/int64(time.Second) + 1},
		{math.MaxInt64, time.Millisecond, math.MaxInt64/int64(time.Millisecond) + 1},
	} {
		if got := WholeUnits(c.d, c.unit); got != c.want {
			t.Errorf("WholeUnits(%v, %v) = %d, want %d", c.d, c.unit, got, c.want)
		}
	}
}

// TestResetInCountsTheTokensMissingFromCap: ResetIn is the later of
// ResetAt and the time the tokens missing from Cap take at Refill (up to
// the microsecond, without float error), and ignores what it cannot know
// (no cap, no rate, nothing missing).
func TestResetInCountsTheTokensMissingFromCap(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		d    Decision
		want time.Duration
	}{
		{"nothing known", Decision{}, 0},
		{"region's bucket only", Decision{ResetAt: now.Add(2 * time.Second)}, 2 * time.Second},
		{"past ResetAt", Decision{ResetAt: now.Add(-time.Second)}, 0},
		{"tokens missing at the rate", Decision{CapKnown: true, Cap: 10, Remaining: 4, Refill: 2}, 3 * time.Second},
		{"the later of the two", Decision{CapKnown: true, Cap: 10, Remaining: 4, Refill: 2, ResetAt: now.Add(5 * time.Second)}, 5 * time.Second},
		{"rounded up to the microsecond", Decision{CapKnown: true, Cap: 1, Refill: 3}, 333334 * time.Microsecond},
		{"no nanosecond of float error", Decision{CapKnown: true, Cap: 3, Refill: 1.0 / 60}, 3 * time.Minute},
		{"nor of a rate in 13 digits", Decision{CapKnown: true, Cap: 2, Refill: 0.01666666666665}, 2 * time.Minute},
		{"nothing missing", Decision{CapKnown: true, Cap: 10, Remaining: 10, Refill: 2, ResetAt: now.Add(time.Second)}, time.Second},
		{"cap unknown", Decision{Cap: 10, Remaining: 4, Refill: 2}, 0},
		{"rate unknown", Decision{CapKnown: true, Cap: 10, Remaining: 4}, 0},
		{"negative remaining counts as none", Decision{CapKnown: true, Cap: 10, Remaining: -5, Refill: 5}, 2 * time.Second},
		{"too long for a Duration", Decision{CapKnown: true, Cap: 1 << 40, Refill: 1e-9, ResetAt: now.Add(time.Hour)}, time.Hour},
		// The float allowance is a billionth of the wait: 1500 s reads
		// a microsecond less, which whole milliseconds round back up.
		{"a billionth less, no more", Decision{CapKnown: true, Cap: 1500, Refill: 1}, 1499999999 * time.Microsecond},
		// Waits are counted below half the longest Duration (about 146
		// years), so the arithmetic never wraps; from there, only ResetAt.
		{"the largest burst at 1/4 per s", Decision{CapKnown: true, Cap: MaxBurst, Refill: 0.25, ResetAt: now.Add(time.Hour)}, 3999999996 * time.Second},
		{"the largest burst at 1/5 per s", Decision{CapKnown: true, Cap: MaxBurst, Refill: 0.2, ResetAt: now.Add(time.Hour)}, time.Hour},
		// 1 / 2.1684043449710086e-10 is maxResetSeconds in float64.
		{"a wait at the bound", Decision{CapKnown: true, Cap: 1, Refill: 2.1684043449710086e-10, ResetAt: now.Add(time.Hour)}, time.Hour},
	} {
		if got := tc.d.ResetIn(now); got != tc.want {
			t.Errorf("%s: ResetIn %v, want %v", tc.name, got, tc.want)
		}
	}
}
