// Package tiny is the mutation tool's test subject.
package tiny

import "strconv"

// Clamp returns v limited to [lo, hi].
func Clamp(v, lo, hi int) int {
	if v < lo {
		return lo
	}
	if v > hi {
		return hi
	}
	return v
}

// Label's + joins strings: it has no - mutant.
func Label(n int) string { return "n" + strconv.Itoa(n) }

// Second's index 1 -> 2 is out of range and does not compile.
func Second(a [2]int) int { return a[1] }
