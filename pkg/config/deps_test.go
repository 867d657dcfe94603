package config

import (
	"os/exec"
	"strings"
	"testing"
)

// offline are packages that must link neither etcd nor gRPC: the config
// schema, and the simulator's scenario reader, traffic, engine and oracle.
// Virtual runs, scenario checks and sluicectl's offline commands build on
// them without a cluster; the config's etcd home is pkg/configstore.
var offline = []string{
	"github.com/sluicehq/sluice/pkg/config",
	"github.com/sluicehq/sluice/sim/engine",
	"github.com/sluicehq/sluice/sim/oracle",
	"github.com/sluicehq/sluice/sim/scenario",
	"github.com/sluicehq/sluice/sim/scenarios",
	"github.com/sluicehq/sluice/sim/traffic",
}

// virtual are the simulator's virtual-mode packages: they must not link
// etcd. They still link gRPC through api/sluice/v1 (its generated service
// stubs share the package with the messages) and pkg/lease (its Client);
// move them to offline once those seams are cut.
var virtual = []string{
	"github.com/sluicehq/sluice/sim/world",
	"github.com/sluicehq/sluice/sim/runner",
	"github.com/sluicehq/sluice/sim/report",
}

// clusterDep reports whether an import path is part of etcd or gRPC.
func clusterDep(path string) bool {
	return etcdDep(path) || strings.HasPrefix(path, "google.golang.org/grpc")
}

func etcdDep(path string) bool { return strings.HasPrefix(path, "go.etcd.io/") }

// TestOfflinePackagesLinkNoEtcdOrGRPC lists the offline and virtual
// packages' dependencies with the go command and fails, naming the import
// chain, when one of them reaches what it must not link.
func TestOfflinePackagesLinkNoEtcdOrGRPC(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not installed")
	}
	// One go list for every root: each invocation loads the whole module
	// graph, and the import map is the same whatever the roots.
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`},
		append(append([]string{}, offline...), virtual...)...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	imports := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		imports[f[0]] = f[1:]
	}
	check := func(pkg string, bad func(string) bool) {
		if _, ok := imports[pkg]; !ok {
			t.Fatalf("go list -deps does not list %s:\n%s", pkg, out)
		}
		if chain := pathTo(imports, pkg, bad); chain != nil {
			t.Errorf("%s links %s: %s", pkg, chain[len(chain)-1], strings.Join(chain, " -> "))
		}
	}
	for _, pkg := range offline {
		check(pkg, clusterDep)
	}
	for _, pkg := range virtual {
		check(pkg, etcdDep)
	}
}

// pathTo is the shortest import chain from root to a package matching
// bad, or nil.
func pathTo(imports map[string][]string, root string, bad func(string) bool) []string {
	prev := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if bad(p) {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, q := range imports[p] {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}
