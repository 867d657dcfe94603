// Package envcount reads the sizes benchmarks and long tests take from
// the environment (SLUICE_EPOCH_BENCH_KEYS=1000000 and the like): a whole
// number of at least a stated minimum, or the test's default when the
// variable is unset. A value that is not such a number fails the test,
// naming the variable, rather than running at a size nobody asked for.
package envcount

import (
	"fmt"
	"os"
	"strconv"
	"testing"
)

// Parse is the count the environment variable name holds, def when it is
// unset or empty, and an error naming name and least when it holds
// anything but a whole number of at least least.
func Parse(name string, def, least int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		return 0, fmt.Errorf("%s=%q: want a whole number of at least %d", name, v, least)
	}
	return n, nil
}

// Get is Parse that fails tb on an error.
func Get(tb testing.TB, name string, def, least int) int {
	tb.Helper()
	n, err := Parse(name, def, least)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
