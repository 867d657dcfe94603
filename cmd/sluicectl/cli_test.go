package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// result is what one CLI invocation produced.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// sluicectl runs the CLI in-process with stdin as given.
func sluicectl(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(t.Context(), args, strings.NewReader(stdin), &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// runApp runs the CLI through an app the test has set up (hooks, a
// pretend terminal).
func runApp(t *testing.T, a *app, args ...string) result {
	t.Helper()
	return runAppContext(t, t.Context(), a, args...)
}

// runAppContext is runApp under ctx, which stands for the signal context:
// cancelling it is SIGINT or SIGTERM.
func runAppContext(t *testing.T, ctx context.Context, a *app, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	a.stdout, a.stderr = &out, &errOut
	if a.getenv == nil {
		a.getenv = func(string) string { return "" }
	}
	if a.stdin == nil {
		a.stdin = strings.NewReader("")
	}
	if a.stdinIsTerminal == nil {
		a.stdinIsTerminal = func() bool { return false }
	}
	code := a.run(ctx, args)
	return result{code, out.String(), errOut.String()}
}

func wantCode(t *testing.T, r result, code int) {
	t.Helper()
	if r.code != code {
		t.Fatalf("want exit %d, got:\n%s", code, r)
	}
}

func wantContains(t *testing.T, where, got string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(got, s) {
			t.Fatalf("%s does not contain %q:\n%s", where, s, got)
		}
	}
}

// cluster is an embedded etcd with the flags that point the CLI at it.
type cluster struct {
	srv   *etcdtest.Server
	cli   *clientv3.Client
	store *configstore.Store
	flags []string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	const prefix = "/sluicectl-test"
	return &cluster{
		srv:   srv,
		cli:   cli,
		store: configstore.NewStore(cli, prefix),
		flags: []string{"-etcd-endpoints", strings.Join(srv.Endpoints(), ","), "-etcd-prefix", prefix, "-timeout", "10s"},
	}
}

// args puts the cluster's global flags before the command.
func (c *cluster) args(cmd ...string) []string {
	return append(append([]string(nil), c.flags...), cmd...)
}

// revision is etcd's whole-store revision: it moves on any write.
func (c *cluster) revision(t *testing.T) int64 {
	t.Helper()
	resp, err := c.cli.Get(t.Context(), "/")
	if err != nil {
		t.Fatalf("etcd get: %v", err)
	}
	return resp.Header.Revision
}

func (c *cluster) config(t *testing.T) (*config.Config, int64) {
	t.Helper()
	cfg, rev, err := c.store.Get(t.Context())
	if err != nil {
		t.Fatalf("store get: %v", err)
	}
	return cfg, rev
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func sample(t *testing.T) string { return writeFile(t, "sample.yaml", string(config.SampleYAML())) }

const invalidYAML = `
regions: {us-east: {weight: 1}}
classes: {read: {}}
tiers:
  free: {read: {rate: 0/s, burst: 10}}
tenants:
  acme: {tier: gold}
default_tier: free
`

func TestValidateAcceptsSampleFromFileAndStdin(t *testing.T) {
	r := sluicectl(t, "", "validate", "-f", sample(t))
	wantCode(t, r, exitOK)
	if r.stdout != "ok: 3 regions, 3 classes, 2 tiers, 1 tenants\n" {
		t.Fatalf("stdout = %q", r.stdout)
	}
	r = sluicectl(t, string(config.SampleYAML()), "validate", "-f", "-")
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "ok: 3 regions")
}

// TestValidateNotesDigestedPrefixes: a valid config whose envoy.domains
// prefix holds a byte no plain tenant holds is accepted with a note
// naming the node, since every value under it has a digest for tenant.
func TestValidateNotesDigestedPrefixes(t *testing.T) {
	cfg := string(config.SampleYAML()) + `
  domains:
    - domain: edge
      descriptors:
        - {key: path, value: "/v1/*", class: read}
        - {key: user, value: "user-*", class: read}
        - {key: route, value: "/api/*/action", class: read}
        - {key: file, value: "files/*", share_threshold: true, class: read}
`
	r := sluicectl(t, "", "validate", "-f", writeFile(t, "paths.yaml", cfg))
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, `note: envoy.domains[0].descriptors[0] (key "path"): every value matching "/v1/*"`,
		`note: envoy.domains[0].descriptors[2] (key "route"): every value matching "/api/*/action"`)
	if strings.Contains(r.stderr, "user-*") {
		t.Errorf("a plain prefix is noted: %s", r.stderr)
	}
	if strings.Contains(r.stderr, "files/*") {
		t.Errorf("a pattern whose values share one bucket is noted: %s", r.stderr)
	}
}

// TestRegionLeaseBelowTheDefaultFailoverWarns: validate and apply accept a
// region_lease shorter than a global failover under the default
// -session-ttl (allocator.FailoverBound: 5s + 0.5s + 5.25 × 200ms = 6.55s)
// with a warning naming the bound, and say nothing at the bound.
func TestRegionLeaseBelowTheDefaultFailoverWarns(t *testing.T) {
	withLease := func(lease string) string {
		y := strings.Replace(string(config.SampleYAML()), "epoch: 1s ", "epoch: 200ms ", 1)
		y = strings.Replace(y, "grant_validity: 5s ", "grant_validity: 1s ", 1)
		return strings.Replace(y, "regions:", "region_lease: "+lease+"\nregions:", 1)
	}
	const warning = "warning: region_lease 2s is shorter than the global tier's failover with the default -session-ttl 5s (session TTL + 0.5s + 5.25 × epoch = 6.55s)"
	short := writeFile(t, "short.yaml", withLease("2s"))
	r := sluicectl(t, "", "validate", "-f", short)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, warning, "raise region_lease to at least 6.55s")
	r = sluicectl(t, "", "validate", "-f", writeFile(t, "bound.yaml", withLease("6.55s")))
	wantCode(t, r, exitOK)
	if strings.Contains(r.stderr, "warning") {
		t.Fatalf("region_lease at the bound warns: %s", r.stderr)
	}

	c := newCluster(t)
	r = sluicectl(t, "", c.args("apply", "-f", short, "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, warning)
}

func TestValidateReportsEveryProblemByField(t *testing.T) {
	r := sluicectl(t, "", "validate", "-f", writeFile(t, "bad.yaml", invalidYAML))
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "2 problems", "tiers.free.read.rate: must be > 0", `tenants.acme.tier: tier "gold"`)
	if r.stdout != "" {
		t.Fatalf("stdout of an invalid config: %q", r.stdout)
	}

	r = sluicectl(t, "", "validate", "-f", writeFile(t, "typo.yaml", "epoch: 1s\nregionz: {}\n"))
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "regionz")

	wantCode(t, sluicectl(t, "", "validate"), exitUsage)
	wantCode(t, sluicectl(t, "", "validate", "-f", filepath.Join(t.TempDir(), "missing.yaml")), exitInvalid)
}

func TestApplyWritesAndGetReadsBack(t *testing.T) {
	c := newCluster(t)
	r := sluicectl(t, "", c.args("get")...)
	wantCode(t, r, exitNotFound)
	wantContains(t, "stderr", r.stderr, "no config in etcd at", "running daemons keep the config they last loaded", "sluicectl apply -f")

	r = sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "--- current", "+++ proposed", "+default_tier: free", "applied: revision ")
	stored, rev := c.config(t)
	if stored == nil || config.Diff(config.Default(), stored) != "" {
		t.Fatalf("etcd holds %+v, want the sample", stored)
	}

	r = sluicectl(t, "", c.args("get")...)
	wantCode(t, r, exitOK)
	got, err := config.Parse([]byte(r.stdout))
	if err != nil {
		t.Fatalf("get output does not parse: %v\n%s", err, r.stdout)
	}
	if d := config.Diff(stored, got); d != "" {
		t.Fatalf("get differs from etcd:\n%s", d)
	}
	if want := fmt.Sprintf("revision %d\n", rev); r.stderr != want {
		t.Fatalf("stderr = %q, want %q", r.stderr, want)
	}

	r = sluicectl(t, "", c.args("get", "-o", "json")...)
	wantCode(t, r, exitOK)
	var doc map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
		t.Fatalf("get -o json: %v\n%s", err, r.stdout)
	}
	if doc["default_tier"] != "free" || doc["epoch"] != "1s" {
		t.Fatalf("get -o json = %v", doc)
	}
	tiers := doc["tiers"].(map[string]any)
	if rate := tiers["free"].(map[string]any)["export"].(map[string]any)["rate"]; rate != "6/m" {
		t.Fatalf("free export rate in JSON = %v, want 6/m", rate)
	}

	// Applying the same config again changes nothing.
	before := c.revision(t)
	r = sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "no changes")
	if after := c.revision(t); after != before {
		t.Fatalf("a no-op apply moved etcd from revision %d to %d", before, after)
	}
}

func TestApplyOfInvalidConfigChangesNothing(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	before := c.revision(t)
	r := sluicectl(t, "", c.args("apply", "-f", writeFile(t, "bad.yaml", invalidYAML), "-yes")...)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "tiers.free.read.rate", "nothing was written")
	if after := c.revision(t); after != before {
		t.Fatalf("invalid apply moved etcd from revision %d to %d", before, after)
	}
	if stored, _ := c.config(t); config.Diff(config.Default(), stored) != "" {
		t.Fatal("etcd no longer holds the sample")
	}
}

func TestApplyLosingARaceIsAConflict(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	_, readRev := c.config(t)

	// Someone else changes the config after sluicectl read it.
	theirs := config.Default()
	theirs.DefaultTier = "pro"
	var theirRev int64
	a := &app{beforeWrite: func() {
		rev, err := c.store.Apply(context.Background(), theirs, readRev)
		if err != nil {
			t.Errorf("concurrent apply: %v", err)
		}
		theirRev = rev
	}}
	mine := strings.Replace(string(config.SampleYAML()), "lease_ttl: 5s", "lease_ttl: 6s", 1)
	r := runApp(t, a, c.args("apply", "-f", writeFile(t, "mine.yaml", mine), "-yes")...)
	wantCode(t, r, exitConflict)
	wantContains(t, "stderr", r.stderr, "changed after it was read", "nothing was written", "run the command again")
	stored, rev := c.config(t)
	if rev != theirRev || stored.DefaultTier != "pro" || stored.LeaseTTL != config.Duration(5*time.Second) {
		t.Fatalf("etcd holds revision %d (theirs %d) with default_tier %q, lease_ttl %v: the losing write landed",
			rev, theirRev, stored.DefaultTier, stored.LeaseTTL)
	}
}

func TestApplyDryRunWritesNothing(t *testing.T) {
	c := newCluster(t)
	before := c.revision(t)
	r := sluicectl(t, "", c.args("apply", "-f", sample(t), "-dry-run")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "+++ proposed", "+  acme:")
	wantContains(t, "stderr", r.stderr, "dry run: nothing written")
	if after := c.revision(t); after != before {
		t.Fatalf("dry run moved etcd from revision %d to %d", before, after)
	}
	if cfg, _ := c.config(t); cfg != nil {
		t.Fatal("dry run stored a config")
	}
}

func TestApplyAsksForConfirmation(t *testing.T) {
	c := newCluster(t)
	before := c.revision(t)

	// No terminal and no -yes: refuse.
	r := sluicectl(t, "", c.args("apply", "-f", sample(t))...)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "pass --yes")
	if strings.Contains(r.stderr, "[y/N]") {
		t.Fatalf("refused without a terminal but printed the prompt first:\n%s", r)
	}
	// The config on stdin cannot also answer the prompt.
	r = runApp(t, &app{stdin: strings.NewReader(string(config.SampleYAML())), stdinIsTerminal: func() bool { return true }},
		c.args("apply", "-f", "-")...)
	wantCode(t, r, exitUsage)

	terminal := func(answer string) *app {
		return &app{stdin: strings.NewReader(answer), stdinIsTerminal: func() bool { return true }}
	}
	r = runApp(t, terminal("n\n"), c.args("apply", "-f", sample(t))...)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "apply? [y/N]", "declined")
	r = runApp(t, terminal(""), c.args("apply", "-f", sample(t))...)
	wantCode(t, r, exitInvalid)
	if after := c.revision(t); after != before {
		t.Fatalf("refused or declined applies moved etcd from revision %d to %d", before, after)
	}

	r = runApp(t, terminal("y\n"), c.args("apply", "-f", sample(t))...)
	wantCode(t, r, exitOK)
	if cfg, _ := c.config(t); cfg == nil {
		t.Fatal("confirmed apply stored nothing")
	}
}

// stuckTerminal is a terminal nobody types on: a read interrupts the
// command (SIGINT at the prompt) and then blocks until the test ends, as a
// read of a real terminal blocks in the kernel.
type stuckTerminal struct {
	interrupt context.CancelFunc
	release   chan struct{}
}

func (s *stuckTerminal) Read([]byte) (int, error) {
	s.interrupt()
	<-s.release
	return 0, io.EOF
}

func TestInterruptAtThePromptEndsTheCommandAtOnce(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	changed := strings.Replace(string(config.SampleYAML()), "default_tier: free", "default_tier: pro", 1)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"apply", []string{"apply", "-f", writeFile(t, "changed.yaml", changed)}},
		{"tenant set", []string{"tenant", "set", "acme", "-shadow=true"}},
		{"region drain", []string{"region", "drain", "eu-west"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := c.revision(t)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			stdin := &stuckTerminal{interrupt: cancel, release: make(chan struct{})}
			t.Cleanup(func() { close(stdin.release) })
			r := runAppContext(t, ctx, &app{stdin: stdin, stdinIsTerminal: func() bool { return true }}, c.args(tc.args...)...)
			wantCode(t, r, exitInterrupted)
			wantContains(t, "stderr", r.stderr, "apply? [y/N]", "interrupted", "nothing was written")
			if after := c.revision(t); after != before {
				t.Fatalf("interrupted prompt moved etcd from revision %d to %d", before, after)
			}
		})
	}
}

func TestIsTerminalOnlyForATerminal(t *testing.T) {
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	regular, err := os.Open(sample(t))
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	for _, tc := range []struct {
		name string
		r    io.Reader
		want bool
	}{
		{"character device that is not a terminal", devNull, false},
		{"pipe", pr, false},
		{"regular file", regular, false},
		{"not a file", strings.NewReader("y\n"), false},
	} {
		if got := isTerminal(tc.r); got != tc.want {
			t.Errorf("%s: isTerminal = %t, want %t", tc.name, got, tc.want)
		}
	}
	t.Run("pseudo-terminal", func(t *testing.T) {
		ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
		if err != nil {
			t.Skipf("no pseudo-terminal to open: %v", err)
		}
		defer ptmx.Close()
		if !isTerminal(ptmx) {
			t.Error("isTerminal(/dev/ptmx) = false, want true")
		}
	})
}

func TestApplyWithStdinFromDevNullRefusesWithoutPrompting(t *testing.T) {
	c := newCluster(t)
	before := c.revision(t)
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	var out, errOut bytes.Buffer
	code := run(t.Context(), c.args("apply", "-f", sample(t)), devNull, &out, &errOut)
	r := result{code, out.String(), errOut.String()}
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "stdin is not a terminal", "pass --yes")
	if strings.Contains(r.stderr, "[y/N]") {
		t.Fatalf("prompted on /dev/null:\n%s", r)
	}
	if after := c.revision(t); after != before {
		t.Fatalf("refused apply moved etcd from revision %d to %d", before, after)
	}
}

func TestTenantSetMovesTenantAndGetShowsIt(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("tenant", "get", "acme")...), exitNotFound)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)

	r := sluicectl(t, "", c.args("tenant", "get", "acme")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "tier:", "pro")
	wantLimit(t, r.stdout, "write", "800/s", "1600", "override")
	wantLimit(t, r.stdout, "read", "2000/s", "4000", "tier pro")

	// An unlisted tenant is no such tenant (exit 4, as for tenant delete
	// and region drain), named on stderr; stdout shows the default tier's
	// limits it resolves to.
	r = sluicectl(t, "", c.args("tenant", "get", "bob")...)
	wantCode(t, r, exitNotFound)
	wantContains(t, "stderr", r.stderr, `tenant "bob" is not listed`, "default_tier free", "tenant set bob -tier")
	wantContains(t, "stdout", r.stdout, "not listed")
	wantLimit(t, r.stdout, "read", "10/s", "20", "tier free")

	// A new tenant needs a tier.
	r = sluicectl(t, "", c.args("tenant", "set", "bob", "-yes")...)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "-tier", "free, pro")

	r = sluicectl(t, "", c.args("tenant", "set", "bob", "-tier", "free", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "+  bob:", "+    tier: free", "applied: revision")
	r = sluicectl(t, "", c.args("tenant", "set", "bob", "-tier", "pro", "-override", "read=3000/s,6000", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "-    tier: free", "+    tier: pro")

	r = sluicectl(t, "", c.args("tenant", "get", "bob")...)
	wantCode(t, r, exitOK)
	wantLimit(t, r.stdout, "read", "3000/s", "6000", "override")
	wantLimit(t, r.stdout, "write", "500/s", "1000", "tier pro")
	stored, _ := c.config(t)
	if got := stored.Tenants["bob"]; got.Tier != "pro" || got.Overrides["read"].Burst != 6000 {
		t.Fatalf("etcd holds bob = %+v", got)
	}

	// Flags may come before the name; -shadow needs its value with "=".
	r = sluicectl(t, "", c.args("tenant", "set", "-remove-override", "read", "bob", "-shadow=true", "-yes")...)
	wantCode(t, r, exitOK)
	if got, _ := c.config(t); got.Tenants["bob"].Overrides != nil || !got.Tenants["bob"].Shadow {
		t.Fatalf("etcd holds bob = %+v, want no overrides and shadow on", got.Tenants["bob"])
	}
	r = sluicectl(t, "", c.args("tenant", "set", "bob", "-shadow", "false", "-yes")...)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "-shadow=false")
}

func TestTenantSetThatFailsValidationChangesNothing(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	before := c.revision(t)

	r := sluicectl(t, "", c.args("tenant", "set", "acme", "-tier", "gold", "-override", "nosuch=1/s,1", "-yes")...)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, `tenants.acme.tier: tier "gold"`, "tenants.acme.overrides.nosuch", "nothing was written")
	r = sluicectl(t, "", c.args("tenant", "set", "acme", "-override", "write=10/s,0.5", "-yes")...)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "tenants.acme.overrides.write.burst")
	r = sluicectl(t, "", c.args("tenant", "set", "acme", "-override", "write=fast", "-yes")...)
	wantCode(t, r, exitUsage)
	r = sluicectl(t, "", c.args("tenant", "set", "acme", "-remove-override", "read", "-yes")...)
	wantCode(t, r, exitNotFound)
	if after := c.revision(t); after != before {
		t.Fatalf("refused tenant changes moved etcd from revision %d to %d", before, after)
	}
}

func TestShadowSetToggles(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("shadow", "set", "class", "write", "on", "-yes")...), exitNotFound)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)

	r := sluicectl(t, "", c.args("shadow", "set", "class", "write", "on", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "+    shadow: true")
	if cfg, _ := c.config(t); !cfg.Classes["write"].Shadow || cfg.Classes["read"].Shadow {
		t.Fatalf("classes after shadow on: %+v", cfg.Classes)
	}
	r = sluicectl(t, "", c.args("tenant", "get", "acme")...)
	wantLimit(t, r.stdout, "write", "800/s", "1600", "override", "true (class)")
	wantLimit(t, r.stdout, "read", "2000/s", "4000", "tier pro", "false")

	r = sluicectl(t, "", c.args("shadow", "set", "class", "write", "on", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "no changes")

	wantCode(t, sluicectl(t, "", c.args("shadow", "set", "tenant", "acme", "on", "-yes")...), exitOK)
	wantCode(t, sluicectl(t, "", c.args("shadow", "set", "class", "write", "off", "-yes")...), exitOK)
	cfg, _ := c.config(t)
	if cfg.Classes["write"].Shadow || !cfg.Tenants["acme"].Shadow {
		t.Fatalf("after class off, tenant on: classes %+v, acme %+v", cfg.Classes, cfg.Tenants["acme"])
	}
	wantCode(t, sluicectl(t, "", c.args("shadow", "set", "tenant", "acme", "off", "-yes")...), exitOK)
	if cfg, _ := c.config(t); cfg.Tenants["acme"].Shadow {
		t.Fatal("tenant shadow still on after off")
	}

	before := c.revision(t)
	r = sluicectl(t, "", c.args("shadow", "set", "tenant", "nobody", "on", "-yes")...)
	wantCode(t, r, exitNotFound)
	wantContains(t, "stderr", r.stderr, "sluicectl tenant set nobody -tier")
	wantCode(t, sluicectl(t, "", c.args("shadow", "set", "class", "nosuch", "on", "-yes")...), exitNotFound)
	wantCode(t, sluicectl(t, "", c.args("shadow", "set", "class", "write", "maybe")...), exitUsage)
	if after := c.revision(t); after != before {
		t.Fatalf("refused shadow changes moved etcd from revision %d to %d", before, after)
	}
}

func TestGetReportsInvalidStoredConfig(t *testing.T) {
	c := newCluster(t)
	if _, err := c.cli.Put(t.Context(), c.store.Key(), invalidYAML); err != nil {
		t.Fatal(err)
	}
	r := sluicectl(t, "", c.args("get")...)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "tiers.free.read.rate", "sluicectl apply -f FILE")

	// apply replaces it.
	r = sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "does not validate; it will be replaced")
	if cfg, _ := c.config(t); cfg == nil {
		t.Fatal("apply did not replace the invalid config")
	}
}

// TestApplyOverInvalidStoredConfigShowsTheTenantsItDeletes: the stored
// document does not validate, but the tenants stored under keys of their
// own are still read, and the diff lists the ones apply deletes (it showed
// the file as all added, and deleted every stored tenant unseen).
func TestApplyOverInvalidStoredConfigShowsTheTenantsItDeletes(t *testing.T) {
	c := newCluster(t)
	for _, id := range []string{"x1", "x2", "x3"} {
		v, err := config.MarshalTenant(config.Tenant{Tier: "free"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.cli.Put(t.Context(), c.store.TenantKey(id), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.cli.Put(t.Context(), c.store.Key(), invalidYAML); err != nil {
		t.Fatal(err)
	}
	before := c.revision(t)
	r := sluicectl(t, "", c.args("apply", "-f", sample(t), "-dry-run")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "does not validate; it will be replaced")
	wantContains(t, "stdout", r.stdout, "+default_tier: free",
		"@@ tenants: 1 added, 0 changed, 3 removed (3 listed before, 1 after) @@", "+  acme:")
	for _, id := range []string{"x1", "x2", "x3"} {
		wantContains(t, "stdout", r.stdout, "-  "+id+":\n-    tier: free\n")
	}
	if after := c.revision(t); after != before {
		t.Fatalf("a dry run moved etcd from revision %d to %d", before, after)
	}

	r = sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "-  x1:\n", "applied: revision")
	cfg, _ := c.config(t)
	if cfg == nil || len(cfg.Tenants) != 1 || cfg.Tenants["acme"].Tier != "pro" {
		t.Fatalf("after the apply etcd holds %+v, want the sample's one tenant", cfg)
	}
}

func TestEnvironmentSuppliesGlobalFlags(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	t.Setenv("SLUICE_ETCD_ENDPOINTS", strings.Join(c.srv.Endpoints(), ","))
	t.Setenv("SLUICE_ETCD_PREFIX", c.store.Prefix())
	r := sluicectl(t, "", "get")
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "default_tier: free")

	// The command line wins over the environment, before or after the command.
	wantCode(t, sluicectl(t, "", "-etcd-prefix", "/elsewhere", "get"), exitNotFound)
	wantCode(t, sluicectl(t, "", "get", "-etcd-prefix", "/elsewhere"), exitNotFound)
}

func TestUnreachableEtcdAndUsageErrors(t *testing.T) {
	dead := grpctest.RefusedAddr(t)
	r := sluicectl(t, "", "-etcd-endpoints", dead, "-timeout", "300ms", "get")
	wantCode(t, r, exitUnreachable)
	wantContains(t, "stderr", r.stderr, dead, "check -etcd-endpoints")

	wantCode(t, sluicectl(t, ""), exitUsage)
	r = sluicectl(t, "", "frobnicate", "--help")
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, `unknown command "frobnicate";`)
	r = sluicectl(t, "", "tenant", "frob", "x")
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, `unknown command "tenant frob";`)
	wantCode(t, sluicectl(t, "", "get", "-o", "xml", "-etcd-endpoints", dead), exitUsage)
	wantCode(t, sluicectl(t, "", "get", "extra", "-etcd-endpoints", dead), exitUsage)
	wantCode(t, sluicectl(t, "", "status", "-top", "0", "-etcd-endpoints", dead), exitUsage)
	wantCode(t, sluicectl(t, "", "status"), exitUsage)
	wantCode(t, sluicectl(t, "", "-etcd-cert", "c.pem", "-etcd-endpoints", dead, "get"), exitUsage)
	r = sluicectl(t, "", "get")
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "SLUICE_ETCD_ENDPOINTS")
	r = sluicectl(t, "", "-h")
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "exit codes:", "3  conflict", "5  unreachable", "6  denied")
}

// TestEveryCommandAndGroupPrintsHelp: -h, -help and --help on every command
// and on every group of commands (tenant, shadow, region) print its usage
// and exit 0; a group without a subcommand lists them and exits 2.
func TestEveryCommandAndGroupPrintsHelp(t *testing.T) {
	groups := map[string]bool{}
	for _, c := range (&app{}).commands() {
		words := strings.Fields(c.name)
		if len(words) > 1 {
			groups[words[0]] = true
		}
		for _, h := range []string{"-h", "-help", "--help"} {
			r := sluicectl(t, "", append(words, h)...)
			wantCode(t, r, exitOK)
			wantContains(t, "stderr", r.stderr, "usage: sluicectl "+c.name)
		}
	}
	for g := range groups {
		for _, h := range []string{"-h", "--help", "help"} {
			r := sluicectl(t, "", g, h)
			wantCode(t, r, exitOK)
			wantContains(t, "stderr", r.stderr, "sluicectl "+g+" ")
			if strings.Contains(r.stderr, "unknown command") {
				t.Fatalf("%s %s: %s", g, h, r)
			}
		}
		r := sluicectl(t, "", g)
		wantCode(t, r, exitUsage)
		wantContains(t, "stderr", r.stderr, g+" needs a subcommand")
	}
	for _, g := range []string{"tenant", "shadow", "region"} {
		if !groups[g] {
			t.Errorf("no command group %q", g)
		}
	}
}

// TestUsageListsEveryCommandsFlags: sluicectl -h names every flag each
// command's own usage names (the top-level list is written by hand).
func TestUsageListsEveryCommandsFlags(t *testing.T) {
	for _, c := range (&app{}).commands() {
		for _, w := range strings.Fields(c.usage) {
			w = strings.Trim(w, "[]()|")
			if !strings.HasPrefix(w, "-") {
				continue
			}
			if !strings.Contains(usageText, w) {
				t.Errorf("sluicectl -h does not list %s of %q", w, c.usage)
			}
		}
	}
}

// wantLimit finds the class's row in tenant get output and checks its cells.
func wantLimit(t *testing.T, out, class string, cells ...string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] != class {
			continue
		}
		row := strings.Join(fields[1:], " ")
		if !strings.HasPrefix(row, strings.Join(cells, " ")) {
			t.Fatalf("row of class %s is %q, want it to start with %q\n%s", class, row, strings.Join(cells, " "), out)
		}
		return
	}
	t.Fatalf("no row for class %s in:\n%s", class, out)
}

// TestConfigTooBigForEtcdIsRefusedByValidateDryRunAndApply: a config whose
// document (everything but its tenants) is over the 1 MiB one etcd key
// holds is refused alike by validate, apply -dry-run and apply, in words
// rather than the limit's Go name, and nothing is written.
func TestConfigTooBigForEtcdIsRefusedByValidateDryRunAndApply(t *testing.T) {
	c := newCluster(t)
	big := writeFile(t, "big.yaml", string(config.SampleYAML())+
		"    - {domain: "+strings.Repeat("d", 1<<20)+", tenant_key: tenant, class_key: class}\n")
	before := c.revision(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"validate", []string{"validate", "-f", big}},
		{"apply -dry-run", c.args("apply", "-f", big, "-dry-run")},
		{"apply -yes", c.args("apply", "-f", big, "-yes")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sluicectl(t, "", tc.args...)
			wantCode(t, r, exitInvalid)
			wantContains(t, "stderr", r.stderr, "the config without its tenants is 1,04", "bytes, more than the 1 MiB one etcd key holds")
			for _, goName := range []string{"MaxDocumentBytes", "configstore."} {
				if strings.Contains(r.stderr, goName) {
					t.Fatalf("stderr names %q:\n%s", goName, r)
				}
			}
			if strings.Contains(r.stdout, "+++ proposed") || strings.HasPrefix(r.stdout, "ok:") {
				t.Fatalf("a config apply refuses was shown as fine:\n%.2000s", r.stdout)
			}
		})
	}
	if after := c.revision(t); after != before {
		t.Fatalf("refused configs moved etcd from revision %d to %d", before, after)
	}
}

// TestCommandHelpQuotesOnlyStringDefaults checks that a command's flags
// print their defaults as the flag package does (and as the global flags
// print theirs): quoted for a string, bare for a number or a duration,
// which a quoted default would pass off as a string.
func TestCommandHelpQuotesOnlyStringDefaults(t *testing.T) {
	wantContains(t, "check -h", sluicectl(t, "", "check", "-h").stderr,
		"(default 1)\n", `(default "127.0.0.1:7400")`, `(default "export")`)
	wantContains(t, "lease -h", sluicectl(t, "", "lease", "-h").stderr, "(default 10)\n")
	wantContains(t, "status -h", sluicectl(t, "", "status", "-h").stderr, "(default 10)\n", `(default "text")`)
	wantContains(t, "certs -h", sluicectl(t, "", "certs", "-h").stderr, "(default 8760h0m0s)\n")
}
