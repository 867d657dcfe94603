package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// sampleWithTenants is the sample config file with n more tenants.
func sampleWithTenants(t *testing.T, n int) string {
	t.Helper()
	sample := string(config.SampleYAML())
	i := strings.Index(sample, "default_tier:")
	var b strings.Builder
	b.WriteString(sample[:i])
	for k := range n {
		fmt.Fprintf(&b, "  t%06d: {tier: free}\n", k)
	}
	b.WriteString(sample[i:])
	return writeFile(t, fmt.Sprintf("tenants-%d.yaml", n), b.String())
}

// TestValidateAndApplyStopWhenInterrupted: a SIGINT or SIGTERM (the
// context sluicectl runs under ends) stops validate and apply with exit
// 130 and nothing written.
func TestValidateAndApplyStopWhenInterrupted(t *testing.T) {
	c := newCluster(t)
	file := sampleWithTenants(t, 2000)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, args := range [][]string{{"validate", "-f", file}, c.args("apply", "-f", file, "-yes")} {
		var out, errOut bytes.Buffer
		code := run(ctx, args, strings.NewReader(""), &out, &errOut)
		if code != exitInterrupted || !strings.Contains(errOut.String(), "interrupted") {
			t.Fatalf("%s with its context ended: exit %d\n%s%s", args[len(args)-3], code, out.String(), errOut.String())
		}
	}
	if cfg, _ := c.config(t); cfg != nil {
		t.Fatal("an interrupted apply wrote a config")
	}
}

func TestValidateRefusesAFileOverTheSizeLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "huge.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: the size is checked before anything is read.
	if err := f.Truncate(config.MaxConfigBytes + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	r := sluicectl(t, "", "validate", "-f", path)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "config.MaxConfigBytes", fmt.Sprint(config.MaxConfigBytes+1))
}

// TestTenantCommandsWriteTenantKeys: tenant set, delete and list go
// through the per-tenant keys, never rewriting the other tenants.
func TestTenantCommandsWriteTenantKeys(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	// Two limits for one class are refused, and nothing is written.
	r := sluicectl(t, "", c.args("tenant", "set", "bob", "-tier", "pro", "-override", "read=3000/s,6000", "-override", "read=5/s,5", "-yes")...)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, `class "read" has another -override already`)
	if key, err := c.cli.Get(t.Context(), c.store.TenantKey("bob")); err != nil || len(key.Kvs) != 0 {
		t.Fatalf("a refused tenant set wrote bob: %v, %v", key, err)
	}
	r = sluicectl(t, "", c.args("tenant", "set", "bob", "-tier", "pro", "-override", "read=3000/s,6000", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "@@ tenants: 1 added, 0 changed, 0 removed @@", "+  bob:", "+    tier: pro")
	key, err := c.cli.Get(t.Context(), c.store.TenantKey("bob"))
	if err != nil || len(key.Kvs) != 1 || !strings.Contains(string(key.Kvs[0].Value), `"tier":"pro"`) {
		t.Fatalf("tenant key of bob: %v, %v", key, err)
	}
	acme, _ := c.cli.Get(t.Context(), c.store.TenantKey("acme"))
	if acme.Kvs[0].ModRevision >= key.Kvs[0].ModRevision {
		t.Fatal("tenant set rewrote acme's key")
	}

	r = sluicectl(t, "", c.args("tenant", "list")...)
	wantCode(t, r, exitOK)
	if want := "TENANT\tTIER\tSHADOW\tOVERRIDES\nacme\tpro\tfalse\twrite=800/s,1600\nbob\tpro\tfalse\tread=3000/s,6000\n"; r.stdout != want {
		t.Fatalf("tenant list =\n%s\nwant\n%s", r.stdout, want)
	}
	r = sluicectl(t, "", c.args("tenant", "list", "-prefix", "b")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "1 tenants listed")

	r = sluicectl(t, "", c.args("tenant", "delete", "bob", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "0 added, 0 changed, 1 removed", "-  bob:")
	if cfg, _ := c.config(t); len(cfg.Tenants) != 1 {
		t.Fatalf("after delete etcd lists %v", cfg.Tenants)
	}
	wantCode(t, sluicectl(t, "", c.args("tenant", "delete", "bob", "-yes")...), exitNotFound)
}

// TestApplyOfManyTenantsWritesThemInBatches applies a file with more
// tenants than one etcd transaction holds, then a change that loses a race
// to a tenant write.
func TestApplyOfManyTenantsWritesThemInBatches(t *testing.T) {
	c := newCluster(t)
	n := 3 * configstore.TxnOps
	r := sluicectl(t, "", c.args("apply", "-f", sampleWithTenants(t, n), "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, fmt.Sprintf("wrote %d of %d tenant changes", n+1, n+1))
	cfg, rev := c.config(t)
	if len(cfg.Tenants) != n+1 {
		t.Fatalf("etcd lists %d tenants, want %d", len(cfg.Tenants), n+1)
	}
	keys, err := c.cli.Get(t.Context(), c.store.TenantPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || keys.Count != int64(n+1) {
		t.Fatalf("%d tenant keys, want %d (%v)", keys.Count, n+1, err)
	}

	// A tenant write lands between the read and the write of an apply.
	a := &app{beforeWrite: func() {
		pro := config.Tenant{Tier: "pro"}
		if _, err := c.store.SetTenants(context.Background(), map[string]*config.Tenant{"t000001": &pro}, rev); err != nil {
			t.Errorf("concurrent tenant set: %v", err)
		}
	}}
	mine := strings.Replace(string(config.SampleYAML()), "lease_ttl: 5s", "lease_ttl: 6s", 1)
	r = runApp(t, a, c.args("apply", "-f", writeFile(t, "mine.yaml", mine), "-yes")...)
	wantCode(t, r, exitConflict)
	if got, _ := c.config(t); got.Tenants["t000001"].Tier != "pro" || len(got.Tenants) != n+1 {
		t.Fatalf("the losing apply landed: %d tenants, t000001 = %+v", len(got.Tenants), got.Tenants["t000001"])
	}
}

// TestValidateStopsWhileReadingStdin: a SIGINT or SIGTERM ends validate
// even while it waits for the rest of its input.
func TestValidateStopsWhileReadingStdin(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	ctx, cancel := context.WithCancel(context.Background())
	code := make(chan int, 1)
	var out, errOut bytes.Buffer
	go func() { code <- run(ctx, []string{"validate", "-f", "-"}, pr, &out, &errOut) }()
	if _, err := pw.Write(config.SampleYAML()[:100]); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case c := <-code:
		if c != exitInterrupted || !strings.Contains(errOut.String(), "interrupted") {
			t.Fatalf("exit %d\n%s%s", c, out.String(), errOut.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("validate still waits for stdin 20s after its context ended")
	}
}

// TestApplyTakeoverFinishesAnInterruptedApply: after a batched apply
// stopped half way, apply is refused naming -takeover, and -takeover
// finishes it, also when etcd compacted the config committed before it.
func TestApplyTakeoverFinishesAnInterruptedApply(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	_, rev := c.config(t)
	want, err := config.Parse(mustRead(t, sampleWithTenants(t, 20*configstore.TxnOps)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	if _, err := c.store.ApplyWith(ctx, want, rev, configstore.ApplyOptions{Progress: func(int, int) { stop() }}); err == nil {
		t.Fatal("the apply was not interrupted")
	}
	file := sampleWithTenants(t, 20*configstore.TxnOps)
	r := sluicectl(t, "", c.args("apply", "-f", file, "-yes")...)
	wantCode(t, r, exitConflict)
	wantContains(t, "stderr", r.stderr, "another apply is in progress", "-takeover")

	// Compact away the config committed before the marker.
	if _, err := c.cli.Compact(t.Context(), c.revision(t)); err != nil {
		t.Fatal(err)
	}
	r = sluicectl(t, "", c.args("apply", "-f", file, "-yes", "-takeover")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "diff below is against an empty config")
	if got, _ := c.config(t); len(got.Tenants) != len(want.Tenants) {
		t.Fatalf("after the takeover etcd lists %d tenants, want %d", len(got.Tenants), len(want.Tenants))
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestTenantChangesRefuseAStoredConfigThatDoesNotValidate: with a stored
// tenant the document does not allow (an unknown tier) or one that does
// not parse, every daemon refuses the whole config; tenant set, delete and
// shadow set refuse to write on top of it, as region drain does, naming
// the tenants at fault, while changing the tenant at fault itself is the
// way out.
func TestTenantChangesRefuseAStoredConfigThatDoesNotValidate(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	wantCode(t, sluicectl(t, "", c.args("tenant", "set", "beta", "-tier", "free", "-yes")...), exitOK)
	if _, err := c.cli.Put(t.Context(), c.store.TenantKey("x1"), `{"tier":"gold"}`); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cli.Put(t.Context(), c.store.TenantKey("x2"), `{"tier":`); err != nil {
		t.Fatal(err)
	}
	before := c.revision(t)
	for _, args := range [][]string{
		{"tenant", "set", "acme", "-shadow=true", "-yes"},
		{"tenant", "set", "newcomer", "-tier", "free", "-yes"},
		{"tenant", "delete", "beta", "-yes"},
		{"shadow", "set", "tenant", "acme", "on", "-yes"},
		{"region", "drain", "eu-west", "-yes"},
	} {
		r := sluicectl(t, "", c.args(args...)...)
		wantCode(t, r, exitInvalid)
		if !strings.Contains(args[0], "region") {
			wantContains(t, "stderr", r.stderr, "is invalid (2 problems)", `tenants.x1.tier: tier "gold"`,
				c.store.TenantKey("x2"), "nothing was written")
		}
		if strings.Contains(r.stdout, "applied") {
			t.Fatalf("%v wrote on top of an invalid config:\n%s", args, r)
		}
	}
	if after := c.revision(t); after != before {
		t.Fatalf("refused tenant changes moved etcd from revision %d to %d", before, after)
	}

	// Fixing the tenants at fault is allowed, and then the rest is too.
	wantCode(t, sluicectl(t, "", c.args("tenant", "set", "x1", "-tier", "free", "-yes")...), exitInvalid) // x2 still does not parse
	if _, err := c.cli.Delete(t.Context(), c.store.TenantKey("x2")); err != nil {
		t.Fatal(err)
	}
	wantCode(t, sluicectl(t, "", c.args("tenant", "set", "x1", "-tier", "free", "-yes")...), exitOK)
	wantCode(t, sluicectl(t, "", c.args("tenant", "set", "acme", "-shadow=true", "-yes")...), exitOK)
	if cfg, _ := c.config(t); cfg == nil || !cfg.Tenants["acme"].Shadow {
		t.Fatalf("etcd holds %+v, want acme in shadow", cfg)
	}
}

// TestInvalidConfigCountsEveryProblemAndListsAtMostMaxProblems: the
// header counts the problems found, not the lines shown, and at most
// config.MaxProblems are listed with the rest counted, whether Validate
// or the YAML decoder found them.
func TestInvalidConfigCountsEveryProblemAndListsAtMostMaxProblems(t *testing.T) {
	sample := string(config.SampleYAML())
	i := strings.Index(sample, "default_tier:")
	file := func(n int, entry string) string {
		var b strings.Builder
		b.WriteString(sample[:i])
		for k := range n {
			fmt.Fprintf(&b, entry, k)
		}
		b.WriteString(sample[i:])
		return writeFile(t, fmt.Sprintf("bad-%d.yaml", n), b.String())
	}
	for _, tc := range []struct {
		name   string
		file   string
		total  int
		listed string
	}{
		{"tenants of an unknown tier", file(5000, "  t%06d: {tier: gold}\n"), 5000, "  tenants.t"},
		{"unknown tenant fields", file(20000, "  t%06d: {tierr: free}\n"), 20000, `  unknown field "tierr"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := sluicectl(t, "", "validate", "-f", tc.file)
			wantCode(t, r, exitInvalid)
			wantContains(t, "stderr", r.stderr, fmt.Sprintf("is invalid (%d problems):\n", tc.total),
				fmt.Sprintf("\n  and %d more problems not listed\n", tc.total-config.MaxProblems))
			if got := strings.Count(r.stderr, "\n"+tc.listed); got != config.MaxProblems {
				t.Fatalf("%d problems listed, want %d:\n%.2000s", got, config.MaxProblems, r.stderr)
			}
		})
	}
}

// TestTenantSetAndDeleteReplaceATenantWhoseStoredValueDoesNotParse: the
// way out that tenant get points at works: tenant set with a -tier
// replaces a stored value that does not parse, and tenant delete deletes
// it, each saying so; shadow set and a tenant set without -tier refuse
// and write nothing.
func TestTenantSetAndDeleteReplaceATenantWhoseStoredValueDoesNotParse(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	unparsable := func() {
		t.Helper()
		if _, err := c.cli.Put(t.Context(), c.store.TenantKey("x1"), `{"tier":`); err != nil {
			t.Fatal(err)
		}
	}
	unparsable()
	r := sluicectl(t, "", c.args("tenant", "get", "x1")...)
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "sluicectl tenant set x1 -tier TIER, or sluicectl tenant delete x1")

	before := c.revision(t)
	r = sluicectl(t, "", c.args("tenant", "set", "x1", "-shadow=true", "-yes")...)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "does not parse: give its -tier")
	wantCode(t, sluicectl(t, "", c.args("shadow", "set", "tenant", "x1", "on", "-yes")...), exitInvalid)
	if after := c.revision(t); after != before {
		t.Fatalf("refused changes moved etcd from revision %d to %d", before, after)
	}

	r = sluicectl(t, "", c.args("tenant", "delete", "x1", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "stored value of tenant x1 does not parse; it is replaced")
	wantContains(t, "stdout", r.stdout, "-  x1: # its stored value does not parse\n", "applied: revision")
	if cfg, _ := c.config(t); cfg == nil {
		t.Fatal("after deleting the tenant that did not parse, the stored config still does not load")
	}

	unparsable()
	r = sluicectl(t, "", c.args("tenant", "set", "x1", "-tier", "free", "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "-  x1: # its stored value does not parse\n", "+  x1:\n+    tier: free\n", "applied: revision")
	cfg, _ := c.config(t)
	if cfg == nil || cfg.Tenants["x1"].Tier != "free" {
		t.Fatalf("etcd holds %+v, want x1 on tier free", cfg)
	}
}
