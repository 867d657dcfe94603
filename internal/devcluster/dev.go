package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/config"
)

// DevOptions configure RunDev.
type DevOptions struct {
	// Config is the deployment's config. Required.
	Config *config.Config
	// Region is the region the printed examples call; it must be in
	// Config. Every region of Config runs. Required.
	Region string
	// Listen fixes Region's gRPC and HTTP addresses. Optional, default
	// free loopback ports.
	Listen ListenAddrs
	// Logger receives the daemons' logs. Optional, default discards.
	Logger *slog.Logger
	// Out receives what runs where and one example call per API.
	// Optional, default discards.
	Out io.Writer
}

// RunDev is development mode (`regional -dev`): a whole deployment in this
// process — embedded etcd holding the config, a global allocator and every
// region of the config, each with its own Redis (redis-server when
// installed, embedded otherwise) and a regional service that leads its
// region, serving the LeaseService, the Envoy rate limit service and gRPC
// reflection. Regions run under the static lease of the global tier, as in
// production: RunDev waits (a bounded time) for every region to hold one,
// starts a local agent (pkg/agent) of Region, then prints what runs where
// and one ready-to-paste example per API,
// then serves until ctx ends and stops everything. A region not in the
// config is an error and starts nothing.
func RunDev(ctx context.Context, o DevOptions) error {
	cfg := o.Config
	if cfg == nil {
		return fmt.Errorf("devcluster: dev mode needs a config")
	}
	regions := sortedKeys(cfg.Regions)
	if _, ok := cfg.Regions[o.Region]; !ok {
		return fmt.Errorf("-region %q is not in the config (regions: %v)", o.Region, regions)
	}
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	start := time.Now()
	c, err := Start(ctx, Options{
		Config: cfg, Regions: regions, GlobalReplicas: 1,
		AllowEmbeddedRedis: true, Envoy: true, Logger: o.Logger,
		Listen: map[string]ListenAddrs{o.Region: o.Listen},
	})
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w (region %s listens on -listen %q and -metrics-listen %q; 127.0.0.1:0 picks free ports)",
			err, o.Region, o.Listen.GRPC, o.Listen.HTTP)
	}
	if err != nil {
		return err
	}
	defer c.Stop()
	// The leaders' first rounds go at once after their elections: a few
	// epochs at most on a quiet machine.
	floor := c.waitStatic(ctx, 20*time.Duration(cfg.Epoch))
	if ctx.Err() != nil {
		return nil
	}
	ag, err := c.StartAgent(o.Region)
	if err != nil {
		return err
	}
	printBanner(out, c, cfg, o.Region, time.Since(start), floor)
	printAgent(out, ag, cfg, o.Region)
	if c.waitLearned(ctx) {
		fmt.Fprintf(out, "The global allocator has learned (%v after start): a key's rate now follows its demand across regions.\n",
			time.Since(start).Round(time.Millisecond))
	}
	<-ctx.Done()
	fmt.Fprintln(out, "stopping")
	return nil
}

// waitLearned polls the global allocator until every shard's leader leads
// out of learning mode, or ctx ends (false).
func (c *Cluster) waitLearned(ctx context.Context) bool {
	for {
		learned := map[int]bool{}
		for _, r := range c.Global {
			if g := r.Daemon(); g != nil && g.Service.IsLeader() && gaugeValue(g.Registry, "sluice_global_learning") == 0 {
				learned[r.Shard()] = true
			}
		}
		if len(learned) == c.opts.Config.ShardMap().N() {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitStatic polls, until every region's first replica hands its scripts
// the static shares or max has passed, each replica's own
// sluice_regional_on_floor. It returns the regions still on their floor.
func (c *Cluster) waitStatic(ctx context.Context, max time.Duration) []string {
	deadline := time.Now().Add(max)
	for {
		var floor []string
		for _, name := range sortedKeys(c.Regions) {
			d := c.Regions[name].Replicas[0].Daemon()
			if d == nil || gaugeValue(d.Registry, "sluice_regional_on_floor") != 0 {
				floor = append(floor, name)
			}
		}
		if len(floor) == 0 || time.Now().After(deadline) {
			return floor
		}
		select {
		case <-ctx.Done():
			return floor
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// gaugeValue is the value of the unlabelled gauge name in reg; -1 when
// absent.
func gaugeValue(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

func printBanner(out io.Writer, c *Cluster, cfg *config.Config, region string, took time.Duration, floor []string) {
	regions := sortedKeys(c.Regions)
	global := c.GlobalAddrs()[0]
	fmt.Fprintf(out, "Sluice dev mode is up (%v): %d regions, a global allocator and etcd, in this process\n",
		took.Round(time.Millisecond), len(regions))
	for _, name := range regions {
		reg := c.Regions[name]
		d := reg.Replicas[0].Daemon()
		redisKind := "redis-server"
		if reg.Redis.Embedded() {
			redisKind = "embedded Redis: redis-server is not installed"
		}
		fmt.Fprintf(out, "  region %-10s %-21s gRPC: LeaseService, Envoy RateLimitService, reflection, health\n", name, d.GRPCAddr())
		fmt.Fprintf(out, "                    %-21s HTTP: /metrics, /healthz, /livez\n", d.HTTPAddr())
		fmt.Fprintf(out, "                    %-21s Redis (%s)\n", reg.Redis.Addr(), redisKind)
	}
	fmt.Fprintf(out, "  global allocator  %-21s gRPC: AllocatorService (region leaders report every %v)\n", global, time.Duration(cfg.Epoch))
	for _, g := range c.Global {
		if d := g.Daemon(); g.Shard() == 0 && d != nil && d.HTTPAddr() != "" {
			fmt.Fprintf(out, "                    %-21s HTTP: /metrics, /healthz, /livez\n", d.HTTPAddr())
			break
		}
	}
	for sh := 1; sh < cfg.ShardMap().N(); sh++ {
		if addrs := c.GlobalShardAddrs(sh); len(addrs) > 0 {
			fmt.Fprintf(out, "    shard %-10d %-21s gRPC: AllocatorService of the keys shard %d owns (global_shards %d)\n", sh, addrs[0], sh, cfg.ShardMap().N())
		}
	}
	fmt.Fprintf(out, "  etcd              %-21s config, elections\n", c.EtcdAddr())
	if len(floor) > 0 {
		fmt.Fprintf(out, "  not yet holding a static lease from the global tier (on the floor): %v\n", floor)
	}
	fmt.Fprintf(out, `Each region holds its static share of every key (rate × weight / Σ weights)
under a static lease from the global allocator. Once the allocator has
learned (one grant_validity, %v, after its election; said below), it moves
a key's rate to the regions that use it: together they admit the key's limit.

`, time.Duration(cfg.GrantValidity))
	ex := c.Regions[region].Replicas[0].Daemon()
	addr, httpAddr := ex.GRPCAddr(), ex.HTTPAddr()
	tenant := exampleTenant(cfg)
	class, strict := exampleClasses(cfg)
	envoyExample := envoyExamples(cfg, tenant, class, addr)
	ctl := sluicectlCommand()
	fmt.Fprintf(out, `Take a lease (LeaseService):
  %s lease -addr %s -tenant %s -class %s -want 10
Check one request (LeaseService, a %s class):
  %s check -addr %s -tenant %s -class %s
See the allocation (every region, its leader and shares):
  %s -etcd-endpoints %s -global-addr %s status
The LeaseService with grpcurl (reflection is on):
  grpcurl -plaintext -d '{"key":{"tenant":"%s","class":"%s"},"cost":1}' %s sluice.v1.LeaseService/Check
The Envoy rate limit service with grpcurl:
%s
Metrics with curl:
  curl -s http://%s/metrics | grep -E '^sluice_regional_(granted_tokens_total|on_floor|leader)'
`, ctl, addr, tenant, class,
		strictWord(cfg, strict), ctl, addr, tenant, strict,
		ctl, c.EtcdAddr(), global,
		tenant, strict, addr,
		envoyExample,
		httpAddr)
}

// printAgent says where the local agent answers, with a /v1/allow
// example (its Envoy endpoint answers as the regions' do), and ends the
// banner.
func printAgent(out io.Writer, a *agent.Agent, cfg *config.Config, region string) {
	tenant := exampleTenant(cfg)
	class, _ := exampleClasses(cfg)
	fmt.Fprintf(out, `The local agent (cmd/agent) of region %s, deciding in memory from its own leases:
  agent             %-21s gRPC: Envoy RateLimitService, reflection, health
                    %-21s HTTP: POST /v1/allow
                    %-21s HTTP operations: /metrics, /healthz, /livez
  curl -s -X POST http://%s/v1/allow -d '{"tenant":"%s","class":"%s","cost":1}'

Ctrl-C stops everything.
`, region, a.GRPCAddr(), a.HTTPAddr(), a.MetricsAddr(), a.HTTPAddr(), tenant, class)
}

func strictWord(cfg *config.Config, class string) string {
	return string(cfg.Classes[class].Mode)
}

// exampleTenant is acme when configured, else the first configured
// tenant, else one that gets the default tier.
func exampleTenant(cfg *config.Config) string {
	if _, ok := cfg.Tenants["acme"]; ok {
		return "acme"
	}
	if names := sortedKeys(cfg.Tenants); len(names) > 0 {
		return names[0]
	}
	return "demo"
}

// envoyExamples are the banner's ShouldRateLimit examples at addr: one
// for the first envoy.descriptors mapping, one for the first path of the
// envoy.domains trees that reaches a class (with how many trees there
// are), or a line saying the config has neither.
func envoyExamples(cfg *config.Config, tenant, class, addr string) string {
	grpcurl := func(domain, entries string) string {
		return fmt.Sprintf(`  grpcurl -plaintext -d '{"domain":"%s","descriptors":[{"entries":[%s]}]}' %s envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
			domain, entries, addr)
	}
	var lines []string
	if ds := cfg.Envoy.Descriptors; len(ds) > 0 {
		entries := fmt.Sprintf(`{"key":"%s","value":"%s"}`, ds[0].TenantKey, tenant)
		if ds[0].ClassKey != "" {
			entries += fmt.Sprintf(`,{"key":"%s","value":"%s"}`, ds[0].ClassKey, class)
		}
		lines = append(lines, grpcurl(ds[0].Domain, entries))
	}
	if trees := cfg.Envoy.Domains; len(trees) > 0 {
		names := make([]string, len(trees))
		for i, d := range trees {
			names[i] = d.Domain
		}
		if len(names) > 5 {
			names = append(names[:5], "…")
		}
		lines = append(lines, fmt.Sprintf("  (envoy.domains holds %d descriptor tree(s): %s)", len(trees), strings.Join(names, ", ")))
		for _, d := range trees {
			if path := classPath(d.Descriptors); path != nil {
				entries := make([]string, len(path))
				for i, n := range path {
					// A value the node matches: its own, a pattern's with
					// each * as "x", any for a node without a value.
					v := strings.ReplaceAll(n.Value, "*", "x")
					if v == "" {
						v = tenant
					}
					entries[i] = fmt.Sprintf(`{"key":"%s","value":"%s"}`, n.Key, v)
				}
				lines = append(lines, grpcurl(d.Domain, strings.Join(entries, ",")))
				break
			}
		}
	}
	if len(lines) == 0 {
		return "  (the config maps no Envoy descriptors: see envoy.descriptors and envoy.domains)"
	}
	return strings.Join(lines, "\n")
}

// classPath is the first path of nodes, depth first, whose last node
// names a class; nil when none does.
func classPath(nodes []config.EnvoyNode) []*config.EnvoyNode {
	for i := range nodes {
		n := &nodes[i]
		if n.Class != "" {
			return []*config.EnvoyNode{n}
		}
		if rest := classPath(n.Descriptors); rest != nil {
			return append([]*config.EnvoyNode{n}, rest...)
		}
	}
	return nil
}

// exampleClasses are the class the lease and Envoy examples use (read when
// configured, else the first lease class) and the one the check examples
// use (the first strict class, else the same).
func exampleClasses(cfg *config.Config) (lease, strict string) {
	names := sortedKeys(cfg.Classes)
	for _, n := range names {
		if cfg.Classes[n].Mode == config.ModeStrict && strict == "" {
			strict = n
		}
		if cfg.Classes[n].Mode != config.ModeStrict && lease == "" {
			lease = n
		}
	}
	if _, ok := cfg.Classes["read"]; ok && cfg.Classes["read"].Mode != config.ModeStrict {
		lease = "read"
	}
	if lease == "" && len(names) > 0 {
		lease = names[0]
	}
	if strict == "" {
		strict = lease
	}
	return lease, strict
}

// sluicectlCommand is how to run sluicectl from any directory: the binary
// beside this one (make build puts them together), else the one on PATH,
// else `go -C <module root> run ./cmd/sluicectl` when this binary was built
// from a source tree that is still there, else plain sluicectl.
func sluicectlCommand() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "sluicectl")
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return shellQuote(p)
		}
	}
	if p, err := exec.LookPath("sluicectl"); err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return shellQuote(abs)
		}
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		root := filepath.Dir(filepath.Dir(filepath.Dir(file))) // internal/devcluster/dev.go
		if mod, err := os.ReadFile(filepath.Join(root, "go.mod")); err == nil &&
			strings.HasPrefix(string(mod), "module github.com/sluicehq/sluice\n") {
			return "go -C " + shellQuote(root) + " run ./cmd/sluicectl"
		}
	}
	return "sluicectl"
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func sortedKeys[V any](m map[string]V) []string {
	var names []string
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}
