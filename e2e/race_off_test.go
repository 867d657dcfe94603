//go:build !race

package e2e

// buildFlags: see race_on_test.go.
var buildFlags []string
