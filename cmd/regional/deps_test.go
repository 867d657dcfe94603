package main

import (
	"os/exec"
	"strings"
	"testing"
)

// testOnly reports whether an import path is a package meant for tests
// only: the standard testing package, gRPC's test helpers (such as
// bufconn), or one of this module's internal test harnesses
// (internal/redistest, internal/tlstest and the like).
func testOnly(path string) bool {
	return path == "testing" ||
		strings.HasPrefix(path, "google.golang.org/grpc/test/") ||
		(strings.HasPrefix(path, "github.com/sluicehq/sluice/internal/") && strings.HasSuffix(path, "test"))
}

// TestCommandsLinkNoTestPackages lists the shipped commands' dependencies
// with the go command and fails, naming the importer, when one of them
// links a test-only package: such code is not held to production
// standards, and the regional daemon's in-memory listener is
// internal/memlisten for that reason.
func TestCommandsLinkNoTestPackages(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not installed")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`,
		"github.com/sluicehq/sluice/cmd/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if testOnly(imp) {
				t.Errorf("%s imports the test-only package %s", f[0], imp)
			}
		}
	}
}
