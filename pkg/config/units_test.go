package config

import (
	"math"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"pgregory.net/rapid"
)

func TestParseRate(t *testing.T) {
	good := []struct {
		in   string
		want float64
	}{
		{"10/s", 10}, {"6/m", 0.1}, {"1000/h", 1000.0 / 3600}, {"5/d", 5.0 / 86400}, {"0.5/s", 0.5}, {"7", 7},
		{"2.5/s", 2.5}, {"2.5", 2.5}, {"-1/s", -1}, {"0/s", 0}, {"1e6/s", 1e6}, {"+3/m", 0.05},
	}
	for _, tc := range good {
		got, err := ParseRate(tc.in)
		if err != nil || float64(got) != tc.want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", tc.in, float64(got), err, tc.want)
		}
	}
	bad := []struct{ in, want string }{
		{"10/x", `unit "x"`},
		{"abc", "not a number"},
		{"", "not a number"},
		{"/s", "not a number"},
		{"10/", `unit ""`},
		{"10/s/s", `unit "s/s"`},
		{"inf/s", "not a number"},
		{"NaN", "not a number"},
		{"0x10/s", "not a number"},
		{"1e400/s", "not a finite number"},
		{"1..2/s", "not a finite number"},
		{"10 /s", "not a number"},
	}
	for _, tc := range bad {
		got, err := ParseRate(tc.in)
		if err == nil {
			t.Errorf("ParseRate(%q) = %v, want an error", tc.in, float64(got))
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.in) {
			t.Errorf("ParseRate(%q) error %q lacks %q or the input", tc.in, err, tc.want)
		}
	}
}

func TestRateStringIsShortestExactForm(t *testing.T) {
	cases := []struct {
		rate Rate
		want string
	}{
		{10, "10/s"},
		{0.1, "6/m"},
		{1000.0 / 3600, "1000/h"},
		{5.0 / 86400, "5/d"},
		{2.5, "2.5/s"}, // ties with 150/m: seconds win
		{0.5, "30/m"},
		{1, "1/s"},
		{1e6, "1000000/s"},
		{0, "0/s"},
		{-1, "-1/s"},
		{1.0 / 3, "20/m"},
		{Rate(math.Nextafter(10, 11)), "600.0000000000001/m"},
	}
	for _, tc := range cases {
		if got := tc.rate.String(); got != tc.want {
			t.Errorf("Rate(%v).String() = %q, want %q", float64(tc.rate), got, tc.want)
		}
	}
}

func TestRateStringParsesBackExactly(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var r float64
		if rapid.Bool().Draw(t, "round") {
			// Rates operators write: a decimal count per unit.
			n := float64(rapid.IntRange(1, 10_000_000).Draw(t, "n")) / float64(rapid.SampledFrom([]int{1, 10, 100}).Draw(t, "div"))
			r = n / rapid.SampledFrom([]float64{1, 60, 3600}).Draw(t, "unit")
		} else {
			r = rapid.Float64Range(1e-9, 1e12).Draw(t, "r")
		}
		s := Rate(r).String()
		back, err := ParseRate(s)
		if err != nil {
			t.Fatalf("ParseRate(%q): %v", s, err)
		}
		if float64(back) != r {
			t.Fatalf("%v -> %q -> %v", r, s, float64(back))
		}
		if strings.ContainsAny(s, "eE") {
			t.Fatalf("%v written with an exponent: %q", r, s)
		}
	})
}

func TestRateMarshalRefusesNonFinite(t *testing.T) {
	for _, r := range []Rate{Rate(math.Inf(1)), Rate(math.Inf(-1)), Rate(math.NaN())} {
		if _, err := r.MarshalYAML(); err == nil {
			t.Errorf("MarshalYAML(%v) succeeded", float64(r))
		}
	}
}

// TestDurationSyntaxIsTheFormParseDurationReads: DurationSyntax holds for
// exactly the strings time.ParseDuration reads, but for the unitless zero
// it also takes (every string of up to four runes drawn from the digits,
// signs, point, units and a stray byte), and for the same forms written
// too large to fit a time.Duration, which ParseDuration refuses: those
// are out of range, not malformed.
func TestDurationSyntaxIsTheFormParseDurationReads(t *testing.T) {
	alphabet := []rune{'0', '1', '9', '.', '+', '-', 'n', 'u', 'µ', 'μ', 'm', 's', 'h', 'x', ' '}
	var walk func(s []rune)
	checked := 0
	walk = func(s []rune) {
		if len(s) > 0 {
			str := string(s)
			_, err := time.ParseDuration(str)
			reads := err == nil && str != "0" && str != "+0" && str != "-0"
			if got := DurationSyntax(str); got != reads {
				t.Errorf("DurationSyntax(%q) = %v; time.ParseDuration reads it with a unit: %v", str, got, reads)
			}
			checked++
		}
		if len(s) == 4 {
			return
		}
		for _, r := range alphabet {
			walk(append(s, r))
		}
	}
	walk(nil)
	if checked < 50000 {
		t.Fatalf("checked %d strings", checked)
	}
	for _, s := range []string{"9999999999h", "-9999999999h", "+9999999999h", "1h9999999999h", "9999999999.5h", "99999999999999999999ns"} {
		if _, err := time.ParseDuration(s); err == nil || !DurationSyntax(s) {
			t.Errorf("%q: ParseDuration error %v, DurationSyntax %v; want refused as out of range", s, err, DurationSyntax(s))
		}
	}
}

// TestDurationUnmarshalEdges pins the positive-duration rule at its edge:
// the smallest positive duration, 1ns, is read as written (Validate then
// judges it against the minimums with its field path), and 0 is refused
// here so a written zero is never replaced by a default.
func TestDurationUnmarshalEdges(t *testing.T) {
	cases := []struct {
		in      string
		want    Duration
		wantErr string
	}{
		{"1ns", 1, ""},
		{"2ns", 2, ""},
		{"0s", 0, `duration "0s" must be positive`},
		{"-1ns", 0, `duration "-1ns" must be positive`},
	}
	for _, tc := range cases {
		var d Duration
		err := yaml.Unmarshal([]byte(tc.in), &d)
		switch {
		case tc.wantErr == "" && (err != nil || d != tc.want):
			t.Errorf("%q: got %v, %v; want %v", tc.in, time.Duration(d), err, time.Duration(tc.want))
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: got %v, %v; want an error containing %q", tc.in, time.Duration(d), err, tc.wantErr)
		}
	}
}
