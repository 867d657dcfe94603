package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDevModeServesTheExampleCall builds the command, starts `regional
// -dev` as a subprocess, waits (at most 10 s) for it to say it is up, runs
// the example call it prints — with a freshly built sluicectl — and
// requires a lease to be granted. Then SIGTERM must stop it cleanly.
func TestDevModeServesTheExampleCall(t *testing.T) {
	dir := t.TempDir()
	regionalBin := filepath.Join(dir, "regional")
	ctlBin := filepath.Join(dir, "sluicectl")
	// One go build for both binaries, with the test's own flags (see
	// buildFlags): its packages come from the build cache.
	build := append(append([]string{"build"}, buildFlags...), "-o", dir+string(filepath.Separator), ".", "../sluicectl")
	if out, err := exec.Command("go", build...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	cmd := exec.Command(regionalBin, "-dev", "-log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var example string
	ready := time.After(10 * time.Second)
	for example == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("dev mode exited before printing the example call")
			}
			if strings.Contains(l, "sluicectl lease ") {
				example = strings.TrimSpace(l)
			}
		case <-ready:
			t.Fatal("dev mode did not print its example call within 10s")
		}
	}
	t.Logf("dev mode up in %v; example: %s", time.Since(started).Round(time.Millisecond), example)

	args := strings.Fields(strings.TrimPrefix(example, "go run ./cmd/sluicectl"))
	out, err := exec.Command(ctlBin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("example call failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "granted 10 of 10 tokens") {
		t.Fatalf("example call did not get a lease:\n%s", out)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	for range lines { // drain until the process closes stdout
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dev mode did not stop cleanly on SIGTERM: %v", err)
	}
}
