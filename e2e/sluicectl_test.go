package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// built is the sluicectl binary the tests share: building and linking it
// (with the test binary's -race) took seconds a test, and every test runs
// the same command.
var built struct {
	once sync.Once
	dir  string // removed by TestMain
	bin  string
	err  error
	out  []byte
}

// sluicectl returns the path of the real sluicectl binary, built once for
// the package.
func sluicectl(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "e2e-sluicectl-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "sluicectl")
		built.out, built.err = exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", built.bin, "../cmd/sluicectl")...).CombinedOutput()
	})
	if built.err != nil {
		t.Fatalf("build sluicectl: %v\n%s", built.err, built.out)
	}
	return built.bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}
