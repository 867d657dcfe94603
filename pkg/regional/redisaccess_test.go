package regional_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// luaCalls lists the Redis commands a Lua source calls.
func luaCalls(src string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`(?:redis\.p?call|try)\(\s*['"]([A-Za-z|]+)['"]`).FindAllStringSubmatch(src, -1) {
		c := strings.ToUpper(m[1])
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	slices.Sort(out)
	return out
}

// TestProbeCallsEveryCommandOfTheScripts: the access probe calls every
// command the scripts call, so a user it passes runs them all. A call
// whose command is not a literal would escape it: there is none.
func TestProbeCallsEveryCommandOfTheScripts(t *testing.T) {
	files, err := filepath.Glob("../luascripts/lua/*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("the scripts: %v %v", files, err)
	}
	probe := luaCalls(regional.ProbeSourceForTest)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all := regexp.MustCompile(`redis\.p?call\(`).FindAllIndex(src, -1)
		if lit := regexp.MustCompile(`redis\.p?call\(\s*['"]`).FindAllIndex(src, -1); len(lit) != len(all) {
			t.Errorf("%s: %d of its redis.call()s name no literal command: the probe cannot know them", f, len(all)-len(lit))
		}
		for _, c := range luaCalls(string(src)) {
			if !slices.Contains(probe, c) {
				t.Errorf("%s calls %s, which the access probe does not", filepath.Base(f), c)
			}
		}
	}
}

// startAs starts a daemon on rs as the recipe's user with password.
func startAs(t *testing.T, addr, password string, logs *logtest.Buffer) (*regional.Daemon, error) {
	t.Helper()
	return regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", RedisAddr: addr,
		RedisUsername: "sluice", RedisPassword: password,
		Config: regional.StaticConfig{C: regiontest.MustConfig(t, quickEpochs)}, ColdStart: regional.ColdStartFull,
		Unleased: true, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
}

// TestStartRefusesAUserShortOfACommand: a user that may not run one
// command the scripts call deep inside (NOPERM only when a script reaches
// it) started, logged "regional service started", stayed ready, and every
// caller degraded. The start now fails naming the command and the fix,
// and leaves Redis as it was.
func TestStartRefusesAUserShortOfACommand(t *testing.T) {
	for _, cmd := range []string{"zadd", "pexpire", "hdel", "zremrangebyscore"} {
		t.Run(cmd, func(t *testing.T) {
			rs := redistest.Start(t)
			applyACL(t, rs.Client(), "-"+cmd)
			var logs logtest.Buffer
			d, err := startAs(t, rs.Addr(), aclPassword, &logs)
			if err == nil {
				d.Stop()
				t.Fatalf("started as a user that may not run %s; log:\n%s", cmd, logs.String())
			}
			if !errors.Is(err, regional.ErrRedisRefused) {
				t.Errorf("error %v does not match ErrRedisRefused", err)
			}
			for _, want := range []string{"lacks a permission", "'" + cmd + "'", "ACL recipe"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if n := redistest.KeyCount(t, rs.Addr()); n != 0 {
				t.Errorf("a refused start left %d keys", n)
			}
		})
	}
}

// TestStartRefusesWrongCredentials: a wrong password was logged as
// "redis not reachable at start" and then, every epoch, "redis: unexpected
// type=<nil> for Slice" from the sentinel check. The start fails saying
// Redis refused the credentials, without the password.
func TestStartRefusesWrongCredentials(t *testing.T) {
	rs := redistest.Start(t)
	applyACL(t, rs.Client())
	const wrong = "not-the-pw-5d1e"
	var logs logtest.Buffer
	d, err := startAs(t, rs.Addr(), wrong, &logs)
	if err == nil {
		d.Stop()
		t.Fatalf("started with a wrong password; log:\n%s", logs.String())
	}
	if !errors.Is(err, regional.ErrRedisRefused) || !strings.Contains(err.Error(), "redis refused the credentials") {
		t.Errorf("error %q, want redis refused the credentials", err)
	}
	if strings.Contains(err.Error()+logs.String(), wrong) {
		t.Errorf("the password is in the error or the log: %q\n%s", err, logs.String())
	}
}

// TestReadinessFollowsAccess: a replica whose Redis user loses a command
// the scripts need while it runs turns NOT_SERVING (PING still answers),
// says why once, and is ready again once the command is granted back.
func TestReadinessFollowsAccess(t *testing.T) {
	// Mostly waits for readiness checks on a Redis of its own: it runs
	// beside the package's other parallel tests.
	t.Parallel()
	rs := redistest.Start(t)
	admin := rs.Client()
	applyACL(t, admin)
	var logs logtest.Buffer
	d, err := startAs(t, rs.Addr(), aclPassword, &logs)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	r := readiness{t: t, d: d, wait: 60 * regional.ReadinessInterval, logs: &logs}
	serving, waitFor := r.serving, r.waitFor
	waitFor("ready", serving)
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "sluice", "-zadd").Err(); err != nil {
		t.Fatal(err)
	}
	// Waits for the reason too: on a starved machine a readiness ping that
	// timed out makes the replica not ready for a check before the
	// revocation is seen.
	const line = "redis refuses this replica access; replica not ready"
	waitFor("not ready once zadd is revoked", func() bool { return !serving() && logs.Count(line) > 0 })
	if n := logs.Count(line); n != 1 || !strings.Contains(logs.String(), "'zadd'") {
		t.Errorf("logged %q %d times (want once, naming zadd):\n%s", line, n, logs.String())
	}
	if err := admin.Do(context.Background(), "ACL", "SETUSER", "sluice", "+zadd").Err(); err != nil {
		t.Fatal(err)
	}
	waitFor("ready again", serving)
}

// TestCredentialsChangedWhileRunning: a password Redis stops taking while
// the replica runs (rotated on the Redis side only) makes the replica not
// ready, and the restart sentinel's log says Redis refused the
// credentials; it said "redis: unexpected type=<nil> for Slice".
func TestCredentialsChangedWhileRunning(t *testing.T) {
	rs := redistest.Start(t)
	admin := rs.Client()
	applyACL(t, admin)
	var logs logtest.Buffer
	d, err := startAs(t, rs.Addr(), aclPassword, &logs)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "sluice", "resetpass", ">rotated").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "CLIENT", "KILL", "USER", "sluice").Err(); err != nil {
		t.Fatal(err)
	}
	epoch := time.Duration(regiontest.MustConfig(t, quickEpochs).Epoch)
	wait := 60 * (regional.ReadinessInterval + epoch)
	const sentinel = `msg="restart sentinel check failed" err="redis refused the credentials`
	const ready = "redis refuses this replica access; replica not ready"
	for deadline := time.Now().Add(wait); logs.Count(sentinel) == 0 || logs.Count(ready) == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("not logged within %v:\n%s", wait, logs.String())
		}
		time.Sleep(epoch / 4) // polling the daemon's log with a deadline
	}
	if strings.Contains(logs.String(), "unexpected type") {
		t.Errorf("the log still reads a refusal as an unexpected reply:\n%s", logs.String())
	}
	resp, err := d.Health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("readiness %v, %v; want NOT_SERVING", resp, err)
	}
}
