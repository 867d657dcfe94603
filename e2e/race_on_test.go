//go:build race

package e2e

// buildFlags are the go build flags of binaries the tests build: the test
// binary's own -race, so the build reuses the packages its test build
// compiled instead of compiling the whole tree again.
var buildFlags = []string{"-race"}
