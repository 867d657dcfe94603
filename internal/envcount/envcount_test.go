package envcount

import (
	"strings"
	"testing"
)

// TestParse: unset or empty is the default; a whole number at or above the
// minimum is taken; anything else is refused, naming the variable, its
// value and the minimum.
func TestParse(t *testing.T) {
	const name = "SLUICE_ENVCOUNT_TEST"
	for _, c := range []struct {
		value string
		want  int
		bad   bool
	}{
		{"", 7, false},
		{"4", 4, false},
		{"1000000", 1_000_000, false},
		{"3", 0, true},
		{"-5", 0, true},
		{"1e6", 0, true},
		{"ten", 0, true},
	} {
		t.Setenv(name, c.value)
		got, err := Parse(name, 7, 4)
		if c.bad {
			if err == nil || !strings.Contains(err.Error(), name+`="`+c.value+`"`) || !strings.Contains(err.Error(), "at least 4") {
				t.Errorf("%q: %d, %v; want an error naming the variable, its value and the minimum", c.value, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %d, %v; want %d", c.value, got, err, c.want)
		}
	}
}
