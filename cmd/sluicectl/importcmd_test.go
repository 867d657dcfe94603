package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/config"
)

const envoyDocs = "../../pkg/envoyrls/importer/testdata/docs"

// TestImportEnvoyRatelimitToFile converts the documented shapes against a
// base file without etcd: the diff on stderr, the config on stdout or in
// the file, which validates; bad input writes nothing.
func TestImportEnvoyRatelimitToFile(t *testing.T) {
	base := sample(t)
	r := sluicectl(t, "", "import", "envoy-ratelimit", envoyDocs, "-base", base, "-o", "-")
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "+++ proposed", "+    - domain: messaging", "note: 8_example8.yaml", "note: README.txt not read: not a .yaml or .yml file",
		`note: example10.yaml: descriptors[0] (key "route"): value_to_metric dropped`)
	cfg, err := config.Parse([]byte(r.stdout))
	if err != nil {
		t.Fatalf("stdout does not parse: %v\n%s", err, r.stdout)
	}
	if cfg.EnvoyTree("rl") == nil || cfg.Tiers["pro"]["rl.foo"].Burst != 2 || cfg.Tenants["acme"].Tier != "pro" {
		t.Errorf("imported config lacks the trees, their limits or the base:\n%s", r.stdout)
	}
	// A trailing * is a prefix wildcard in the written config, as in
	// envoyproxy/ratelimit's; share_threshold carries over.
	if tree := cfg.EnvoyTree("example9"); tree == nil || tree.Descriptors[3].Value != "/api/*" || tree.Descriptors[3].Exact() ||
		!cfg.EnvoyTree("example11").Descriptors[0].ShareThreshold {
		t.Errorf("imported wildcards:\n%s", r.stdout)
	}

	out := filepath.Join(t.TempDir(), "sluice.yaml")
	r = sluicectl(t, "", "import", "envoy-ratelimit", "-base", base, "-o", out, envoyDocs)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "wrote "+out)
	if r := sluicectl(t, "", "validate", "-f", out); r.code != exitOK {
		t.Fatalf("the written file does not validate:\n%s", r)
	}
	// Importing again into the written file changes nothing.
	r = sluicectl(t, "", "import", "envoy-ratelimit", "-base", out, "-o", "-", envoyDocs)
	wantCode(t, r, exitOK)
	wantContains(t, "stderr", r.stderr, "no changes")

	// Refusals name the file and the descriptor, and write nothing.
	refused := filepath.Join(t.TempDir(), "refused.yaml")
	r = sluicectl(t, "", "import", "envoy-ratelimit", "-base", base, "-o", refused, "../../pkg/envoyrls/importer/testdata/refused/replaces")
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, `example7.yaml: descriptors[1].descriptors[0] (key "user"): rate_limit.replaces`, "nothing was written")
	if _, err := os.Stat(refused); !os.IsNotExist(err) {
		t.Errorf("a refused import wrote %s (%v)", refused, err)
	}
	r = sluicectl(t, "", "import", "envoy-ratelimit", "-base", base, "-o", refused, "../../pkg/envoyrls/importer/testdata/refused/quota_mode")
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, `quota.yaml: descriptors[0] (key "user"): quota_mode has no Sluice equivalent`, "nothing was written")
	wantCode(t, sluicectl(t, "", "import", "envoy-ratelimit", "-o", "-", envoyDocs), exitUsage)
	wantCode(t, sluicectl(t, "", "import", "envoy-ratelimit"), exitUsage)
	r = sluicectl(t, "", "import", "envoy-ratelimit", "-base", base, "-o", "-", t.TempDir())
	wantCode(t, r, exitInvalid)
	wantContains(t, "stderr", r.stderr, "no .yaml or .yml file")
}

// TestImportEnvoyRatelimitToEtcd writes through apply's path: diff first,
// dry run writes nothing, -yes writes one revision.
func TestImportEnvoyRatelimitToEtcd(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	_, rev := c.config(t)

	r := sluicectl(t, "", c.args("import", "envoy-ratelimit", envoyDocs, "-dry-run")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "+    - domain: mongo_cps")
	if _, now := c.config(t); now != rev {
		t.Fatalf("dry run wrote revision %d", now)
	}
	r = sluicectl(t, "", c.args("import", "envoy-ratelimit", envoyDocs)...)
	wantCode(t, r, exitUsage)
	wantContains(t, "stderr", r.stderr, "stdin is not a terminal")

	r = sluicectl(t, "", c.args("import", "envoy-ratelimit", envoyDocs, "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "applied: revision")
	cfg, _ := c.config(t)
	if len(cfg.Envoy.Domains) != 12 || !strings.HasPrefix(cfg.Envoy.Domains[0].Domain, "mongo_cps") {
		t.Errorf("etcd holds domains %+v", cfg.Envoy.Domains)
	}
	r = sluicectl(t, "", c.args("import", "envoy-ratelimit", envoyDocs, "-yes")...)
	wantCode(t, r, exitOK)
	wantContains(t, "stdout", r.stdout, "no changes")
}
