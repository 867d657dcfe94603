package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// runMain runs the command (main, in a copy of the test binary) and
// returns its stderr and exit code.
func runMain(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return stderr.String(), 0
	case errors.As(err, &ee):
		return stderr.String(), ee.ExitCode()
	}
	t.Fatal(err)
	return "", 0
}

// TestStartFailureNamesTheCommandOnceAndWarnsOfTheSample: a regional
// started without -config says at WARN that it serves the built-in sample
// tenants, and an error from the service is prefixed "regional:" once.
func TestStartFailureNamesTheCommandOnceAndWarnsOfTheSample(t *testing.T) {
	// An address that cannot be listened on fails before Redis is needed.
	stderr, code := runMain(t, "-listen", "256.0.0.1:1", "-metrics-listen", "off")
	if code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "regional: listen 256.0.0.1:1") || strings.Contains(stderr, "regional: regional:") {
		t.Errorf("want the error prefixed once:\n%s", stderr)
	}
	var warned bool
	for _, l := range strings.Split(stderr, "\n") {
		warned = warned || strings.Contains(l, "level=WARN") && strings.Contains(l, "built-in sample config") && strings.Contains(l, "tenants=acme")
	}
	if !warned {
		t.Errorf("no WARN that the built-in sample tenants are served:\n%s", stderr)
	}

	// With a config file there is nothing to warn about.
	file := t.TempDir() + "/c.yaml"
	if err := os.WriteFile(file, []byte("regions: {us-east: {weight: 1}}\nclasses: {read: {mode: lease, on_failure: local}}\ntiers: {free: {read: {rate: 1/s, burst: 1}}}\ndefault_tier: free\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stderr, code = runMain(t, "-config", file, "-listen", "256.0.0.1:1", "-metrics-listen", "off")
	if code != 1 || strings.Contains(stderr, "built-in sample") {
		t.Errorf("exit %d with -config, want 1 and no sample warning:\n%s", code, stderr)
	}
}

// TestBadFlagValuesAreRefusedNamingTheFlag: values the service would
// refuse in the words of its options (rpcguard's PerConnection) are
// refused at start naming the flag.
func TestBadFlagValuesAreRefusedNamingTheFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-max-inflight-per-connection", "-1"}, "regional: -max-inflight-per-connection -1 must be at least 1"},
		{[]string{"-max-inflight-per-connection", "0"}, "regional: -max-inflight-per-connection 0 must be at least 1"},
		{[]string{"-max-inflight-per-connection", "100", "-max-inflight-per-identity", "10"},
			"regional: -max-inflight-per-identity 10 must be at least -max-inflight-per-connection (100)"},
		{[]string{"-session-ttl", "-5s"}, "regional: -session-ttl -5s must be positive"},
	} {
		stderr, code := runMain(t, append(tc.args, "-listen", "127.0.0.1:0", "-metrics-listen", "off")...)
		if code != 1 || !strings.Contains(stderr, tc.says) {
			t.Errorf("%v: exit %d, want 1 saying %q:\n%s", tc.args, code, tc.says, stderr)
		}
		for _, goName := range []string{"rpcguard", "PerConnection", "PerIdentity"} {
			if strings.Contains(stderr, goName) {
				t.Errorf("%v: stderr names %q:\n%s", tc.args, goName, stderr)
			}
		}
	}
}
