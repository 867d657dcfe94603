package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// An outcome is what the tests did with one mutant.
type outcome int

const (
	killed outcome = iota
	survived
	timedOut
	notCompiling
)

func (o outcome) String() string {
	return [...]string{"killed", "survived", "timed out", "not compiling"}[o]
}

// runner runs go test on mutants.
type runner struct {
	pkgDir string   // the package as given to go test
	nice   []string // command prefix, e.g. nice -n 10
	run    string   // -run
	skip   string   // -skip
	// binFlags go to the test binary after the package (e.g. rapid's,
	// when the tests use it).
	binFlags []string
	race     bool
	timeout  time.Duration // go test -timeout for the test binary
	tmp      string
	verbose  bool
}

// testArgs is the go test command line without the overlay.
func (r *runner) testArgs() []string {
	args := append([]string{}, r.nice...)
	args = append(args, "go", "test", "-count=1", "-failfast", "-vet=off")
	if r.race {
		args = append(args, "-race")
	}
	if r.run != "" {
		args = append(args, "-run", r.run)
	}
	if r.skip != "" {
		args = append(args, "-skip", r.skip)
	}
	if r.timeout > 0 {
		args = append(args, "-timeout", r.timeout.String())
	}
	return args
}

// baseline runs the unmutated tests: they must pass, or every mutant
// would count as killed. It returns how long they took.
func (r *runner) baseline(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	args := append(append(r.testArgs(), r.pkgDir), r.binFlags...)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("the unmutated tests fail (%s): %w\n%s", strings.Join(args, " "), err, out)
	}
	return time.Since(start), nil
}

// try runs the tests against m through an overlay that maps m's file to a
// mutated copy, so the source tree is never written and mutants can run
// side by side.
func (r *runner) try(ctx context.Context, id int, m *mutant) (outcome, string, error) {
	res, text, err := r.try1(ctx, id, m)
	if err != nil || !m.file.lua || !buildFailed(text) {
		return res, text, err
	}
	// An embedded file's bytes cannot break the Go build, so a Lua
	// mutant's build failure is the machine's (a build cache or a disk
	// under another user's load): tried once more, it stops the run
	// rather than count as not compiling.
	res, text, err = r.try1(ctx, id, m)
	if err == nil && buildFailed(text) {
		err = fmt.Errorf("%s: the build failed with only a Lua file changed: %s", m, firstLines(text, 5))
	}
	return res, text, err
}

func buildFailed(text string) bool {
	return strings.Contains(text, "[build failed]") || strings.Contains(text, "[setup failed]")
}

func (r *runner) try1(ctx context.Context, id int, m *mutant) (outcome, string, error) {
	dir := filepath.Join(r.tmp, fmt.Sprint(id))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, "", err
	}
	defer os.RemoveAll(dir)
	mutated := filepath.Join(dir, filepath.Base(m.file.abs))
	if err := os.WriteFile(mutated, m.apply(), 0o644); err != nil {
		return 0, "", err
	}
	ov, err := json.Marshal(map[string]map[string]string{"Replace": {m.file.abs: mutated}})
	if err != nil {
		return 0, "", err
	}
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		return 0, "", err
	}
	args := append(append(r.testArgs(), "-overlay", ovPath, r.pkgDir), r.binFlags...)
	// The test binary's own -timeout normally ends a hung mutant; this
	// deadline also covers the build and a binary that ignores it.
	ctx, cancel := context.WithTimeout(ctx, r.timeout+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	setProcessGroup(cmd)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	text := out.String()
	switch {
	case err == nil:
		return survived, text, nil
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return timedOut, text, nil
	case ctx.Err() != nil:
		return 0, text, ctx.Err()
	case buildFailed(text):
		return notCompiling, text, nil
	case m.file.lua && strings.Contains(text, luaCompileError):
		// Redis refused to load the mutated script: the Lua
		// counterpart of a build failure.
		return notCompiling, text, nil
	case strings.Contains(text, "panic: test timed out after"):
		return timedOut, text, nil
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return 0, text, fmt.Errorf("running %s: %w", strings.Join(args, " "), err)
	}
	return killed, text, nil
}
