package observability

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/endpoint"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
)

const (
	alertsFile     = "alerts.yaml"
	dashboardFile  = "dashboard.json"
	operationsFile = "../../docs/operations.md"
	// runbookBase is where every alert's runbook_url must point.
	runbookBase = "https://github.com/sluicehq/sluice/blob/main/docs/operations.md#"
	// unusedAddr is a loopback address nothing listens on: the components
	// built here connect lazily and never send anything.
	unusedAddr = "127.0.0.1:1"
)

// requiredAlerted are the families the rules must alert on (the failure
// modes every deployment must page or warn about).
var requiredAlerted = []string{
	"sluice_client_decisions_total",           // deny ratio high and low, decisions stopped
	"sluice_regional_redis_errors_total",      // Redis errors above zero, Redis down
	"sluice_regional_lua_duration_seconds",    // Lua p99 over budget
	"sluice_regional_redis_data_losses_total", // Redis restarted empty
	"sluice_regional_redis_evicting",          // Redis evicts keys
	"sluice_regional_requests_total",          // regional RPC errors, invalid requests
	"sluice_client_degraded",                  // degraded mode
	"sluice_client_degraded_episodes_total",   // degraded episodes shorter than a scrape
	"sluice_client_credentials_refused",       // the region refuses an instance's certificate
	"sluice_client_rpc_duration_seconds",      // lease RPCs slow or failing
	"sluice_envoy_degraded_decisions_total",   // Envoy decided by on_failure
	"sluice_global_leader",                    // no global leader, two leaders
	"sluice_global_learning",                  // learning stuck
	"sluice_global_epoch",                     // allocation stalled
	"sluice_global_allocation_seconds",        // allocation slow
	"sluice_global_region_report_age_seconds", // grants stale
	"sluice_global_reports_total",             // regions silent, reports refused
	"sluice_config_rejected_total",            // config rejected
	"sluice_config_stored_refused",            // config stored refused
	"sluice_config_watch_errors_total",        // etcd unavailable
	"sluice_config_last_applied_revision",     // config diverged

	// Static shares that change (docs/architecture.md, invariant 2).
	"sluice_regional_chain_started_unconfirmed_total", // a replica started without its region's confirmed config
	"sluice_regional_chain_unconfirmed",               // and still runs so
	"sluice_global_config_history_failed_total",       // the global leader cannot read a reported config
}

// requiredPanels are the families the dashboard must show.
var requiredPanels = []string{
	"sluice_client_decisions_total", "sluice_regional_decisions_total",
	"sluice_client_decision_duration_seconds", "sluice_client_rpc_duration_seconds",
	"sluice_regional_rpc_duration_seconds", "sluice_regional_lua_duration_seconds",
	"sluice_regional_redis_errors_total", "sluice_client_degraded", "sluice_regional_active_leases",
	"sluice_regional_reclaimed_tokens_total", "sluice_global_leader", "sluice_global_learning",
	"sluice_global_granted_rate", "sluice_global_region_report_age_seconds",
	"sluice_global_contended_keys", "sluice_global_allocation_seconds", "sluice_config_rejected_total",
	"sluice_envoy_decisions_total", "sluice_regional_redis_evicting", "sluice_regional_redis_evicted_keys_total",
	"sluice_client_credentials_refused",
}

// requiredRunbookSections are the anchors docs/operations.md must have: one
// per failure of DESIGN §3 and per alerting symptom.
var requiredRunbookSections = []string{
	"instance-crash", "regional-replica-crash", "regional-leader-crash", "regional-redis-down",
	"redis-restarted-empty", "redis-evicts-keys", "global-leader-crash", "region-partitioned-from-global",
	"etcd-unavailable", "bad-config-pushed", "deny-ratio-high", "deny-ratio-low", "lua-slow",
	"config-rejected", "no-global-leader", "grants-stale", "redis-errors", "degraded-mode", "credentials-refused",
	"config-change-unconfirmed",
	"deploy", "tuning",
}

// ---------------------------------------------------------------------------
// Collecting what the code exports.

// recorder is a prometheus.Registerer that keeps what components register
// so their families can be listed from Describe (and typed from Collect).
// Safe for concurrent use.
type recorder struct {
	source string
	mu     sync.Mutex             // guards colls
	colls  []prometheus.Collector // guarded by mu
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.colls = append(r.colls, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) Unregister(prometheus.Collector) bool { return true }

// parsedDesc is what Desc.String reveals of a descriptor.
type parsedDesc struct {
	name   string
	labels []string
}

var fqNameRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*")`)

// parseDesc reads the metric name and the constant and variable label
// names out of Desc.String(); client_golang exposes them no other way.
func parseDesc(s string) (parsedDesc, error) {
	m := fqNameRE.FindStringSubmatch(s)
	if m == nil {
		return parsedDesc{}, fmt.Errorf("no fqName in %s", s)
	}
	name, err := strconv.Unquote(m[1])
	if err != nil {
		return parsedDesc{}, fmt.Errorf("fqName in %s: %w", s, err)
	}
	if name == "" {
		return parsedDesc{}, fmt.Errorf("invalid descriptor %s", s)
	}
	out := parsedDesc{name: name}
	const vlKey, clKey = ", variableLabels: {", ", constLabels: {"
	vi := strings.LastIndex(s, vlKey)
	ci := strings.LastIndex(s[:max(vi, 0)], clKey)
	if vi < 0 || ci < 0 || !strings.HasSuffix(s, "}}") {
		return parsedDesc{}, fmt.Errorf("unexpected descriptor form %s", s)
	}
	for _, l := range strings.Split(s[vi+len(vlKey):len(s)-2], ",") {
		l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")")
		if l != "" {
			out.labels = append(out.labels, l)
		}
	}
	// constLabels: name="quoted value",...
	cl := s[ci+len(clKey) : vi-1]
	for cl != "" {
		eq := strings.IndexByte(cl, '=')
		if eq < 0 {
			return parsedDesc{}, fmt.Errorf("constant labels %q of %s", cl, s)
		}
		out.labels = append(out.labels, cl[:eq])
		q, err := strconv.QuotedPrefix(cl[eq+1:])
		if err != nil {
			return parsedDesc{}, fmt.Errorf("constant labels %q of %s: %w", cl, s, err)
		}
		cl = strings.TrimPrefix(cl[eq+1+len(q):], ",")
	}
	return out, nil
}

// fresh is a copy of c without recorded series, for checking one rule file.
func (c *catalog) fresh() *catalog {
	return &catalog{
		families: c.families, literals: c.literals,
		recorded: map[string]map[string]bool{}, recordedSources: map[string][]string{},
	}
}

// add merges one family seen from a component into the catalog.
func (c *catalog) add(source, name, kind string, labels []string) error {
	f, ok := c.families[name]
	if !ok {
		f = &family{name: name, labels: map[string]bool{}}
		c.families[name] = f
	}
	if kind != "" && f.kind != "" && kind != f.kind {
		return fmt.Errorf("%s is a %s in %s and a %s in %s", name, f.kind, strings.Join(f.sources, ", "), kind, source)
	}
	if kind != "" {
		f.kind = kind
	}
	for _, l := range labels {
		f.labels[l] = true
	}
	if !slices.Contains(f.sources, source) {
		f.sources = append(f.sources, source)
	}
	return nil
}

func kindOf(m *dto.Metric) string {
	switch {
	case m.Counter != nil:
		return "counter"
	case m.Gauge != nil:
		return "gauge"
	case m.Histogram != nil:
		return "histogram"
	case m.Summary != nil:
		return "summary"
	}
	return "untyped"
}

// harvest lists the families of every collector r received: names and
// labels from Describe, kinds from the vector types and from whatever
// samples Collect emits now.
func (c *catalog) harvest(r *recorder) error {
	r.mu.Lock()
	colls := slices.Clone(r.colls)
	r.mu.Unlock()
	for _, coll := range colls {
		kind := ""
		switch coll.(type) {
		case *prometheus.CounterVec:
			kind = "counter"
		case *prometheus.GaugeVec:
			kind = "gauge"
		case *prometheus.HistogramVec:
			kind = "histogram"
		case *prometheus.SummaryVec:
			kind = "summary"
		}
		descs := make(chan *prometheus.Desc)
		go func() { coll.Describe(descs); close(descs) }()
		for d := range descs {
			pd, err := parseDesc(d.String())
			if err != nil {
				return fmt.Errorf("%s: %w", r.source, err)
			}
			if err := c.add(r.source, pd.name, kind, pd.labels); err != nil {
				return err
			}
		}
		metrics := make(chan prometheus.Metric)
		go func() { coll.Collect(metrics); close(metrics) }()
		for m := range metrics {
			pd, err := parseDesc(m.Desc().String())
			if err != nil {
				return fmt.Errorf("%s: %w", r.source, err)
			}
			var w dto.Metric
			if err := m.Write(&w); err != nil {
				return fmt.Errorf("%s: %s: %w", r.source, pd.name, err)
			}
			if err := c.add(r.source, pd.name, kindOf(&w), nil); err != nil {
				return err
			}
		}
	}
	return nil
}

// gathered adds the families a registry holds samples for.
// gathered adds the families g gathers whose names start with prefix.
func (c *catalog) gathered(source, prefix string, g prometheus.Gatherer) error {
	mfs, err := g.Gather()
	if err != nil {
		return fmt.Errorf("%s: gather: %w", source, err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), prefix) {
			continue
		}
		kind := strings.ToLower(mf.GetType().String())
		var labels []string
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		if err := c.add(source, mf.GetName(), kind, labels); err != nil {
			return err
		}
	}
	return nil
}

var (
	exportedOnce sync.Once
	exported     *catalog
	exportedErr  error
)

// exportedFamilies builds every component that exports sluice_* metrics,
// in process, and lists their families. Built once per test binary.
func exportedFamilies(t *testing.T) *catalog {
	t.Helper()
	exportedOnce.Do(func() {
		exported, exportedErr = buildCatalog(t)
	})
	if exportedErr != nil {
		t.Fatalf("listing exported metrics: %v", exportedErr)
	}
	return exported
}

func buildCatalog(t *testing.T) (*catalog, error) {
	cat := &catalog{families: map[string]*family{}, literals: map[string]map[string]bool{}}
	cfg := config.Default()
	quiet := slog.New(slog.DiscardHandler)

	// Regional service (pkg/regional): nothing dials Redis at construction.
	regRec := &recorder{source: "pkg/regional"}
	rdb := redis.NewClient(&redis.Options{Addr: unusedAddr})
	defer rdb.Close()
	srv, err := regional.New(regional.Options{
		Region: "us-east", Redis: rdb, Config: regional.StaticConfig{C: cfg}, Logger: quiet, Registerer: regRec,
	})
	if err != nil {
		return nil, fmt.Errorf("regional.New: %w", err)
	}
	defer srv.Close()

	// Instance client (pkg/lease): grpc.NewClient connects lazily.
	leaseRec := &recorder{source: "pkg/lease"}
	conn, err := grpc.NewClient(unusedAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("grpc.NewClient: %w", err)
	}
	defer conn.Close()
	cli, err := lease.NewClient(conn, lease.Options{InstanceID: "metrics-catalog", Registerer: leaseRec})
	if err != nil {
		return nil, fmt.Errorf("lease.NewClient: %w", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cli.Close(ctx)
	}()

	// Config watcher (pkg/config): the store is only read by Run.
	cfgRec := &recorder{source: "pkg/config"}
	configstore.NewWatcher(configstore.NewStore(nil, ""), cfg, quiet, cfgRec)

	// Envoy rate-limit service (pkg/envoyrls).
	envoyRec := &recorder{source: "pkg/envoyrls"}
	if _, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: cfg}, Registerer: envoyRec, Logger: quiet}); err != nil {
		return nil, fmt.Errorf("envoyrls.New: %w", err)
	}

	// Every daemon's endpoint (internal/endpoint) adds the Go runtime's
	// and the process's standard families to its registry, which alerts
	// read too (process_start_time_seconds tells a restart apart).
	epReg := prometheus.NewRegistry()
	ep, err := endpoint.Listen(endpoint.Options{Name: "metrics-catalog", GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", Registry: epReg, Logger: quiet})
	if err != nil {
		return nil, fmt.Errorf("endpoint.Listen: %w", err)
	}
	ep.Close()
	if err := cat.gathered("internal/endpoint", "", epReg); err != nil {
		return nil, err
	}

	for _, r := range []*recorder{regRec, leaseRec, cfgRec, envoyRec} {
		if err := cat.harvest(r); err != nil {
			return nil, err
		}
	}

	// Global allocator (pkg/allocator): its daemon takes a Registry, so
	// its families are gathered from samples after one report was
	// answered, which gives every per-region series a value.
	if err := allocatorFamilies(t, cat, cfg, quiet); err != nil {
		return nil, err
	}
	for _, f := range cat.families {
		for _, src := range f.sources {
			if _, ok := cat.literals[src]; ok {
				continue
			}
			lits, err := stringLiterals(filepath.Join("..", "..", filepath.FromSlash(src)))
			if err != nil {
				return nil, err
			}
			cat.literals[src] = lits
		}
	}
	return cat.fresh(), nil
}

// stringLiterals collects every string literal of the non-test Go files in
// dir: the label values the package can write.
func stringLiterals(dir string) (map[string]bool, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the source of %s: %w", dir, err)
	}
	out := map[string]bool{}
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", e.Name(), err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil {
					out[v] = true
				}
			}
			return true
		})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no Go source with string literals in %s", dir)
	}
	return out, nil
}

func allocatorFamilies(t *testing.T, cat *catalog, cfg *config.Config, logger *slog.Logger) error {
	etcd := etcdtest.Start(t)
	reg := prometheus.NewRegistry()
	d, err := allocator.StartDaemon(context.Background(), allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "off", Etcd: etcd.Client(t), Prefix: "/observability",
		SessionTTL: time.Second, Config: allocator.StaticConfig{C: cfg}, Registry: reg, Logger: logger,
	})
	if err != nil {
		return fmt.Errorf("allocator.StartDaemon: %w", err)
	}
	defer d.Stop()
	deadline := time.Now().Add(20 * time.Second)
	for !d.IsLeader() {
		if time.Now().After(deadline) {
			return fmt.Errorf("allocator daemon never became leader")
		}
		time.Sleep(10 * time.Millisecond) // polling the election with a deadline
	}
	_, err = d.Service.Sync(context.Background(), &sluicev1.RegionReport{
		Region: "us-east", Seq: 1,
		Keys: []*sluicev1.KeyDemand{{Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "read"}, Admitted: 10, WindowMs: 1000}},
	})
	if err != nil {
		return fmt.Errorf("allocator Sync: %w", err)
	}
	return cat.gathered("pkg/allocator", "sluice_", reg)
}

// ---------------------------------------------------------------------------
// The files.

type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name     string `yaml:"name"`
	Interval string `yaml:"interval"`
	Rules    []rule `yaml:"rules"`
}

type rule struct {
	Alert         string            `yaml:"alert"`
	Record        string            `yaml:"record"`
	Expr          string            `yaml:"expr"`
	For           string            `yaml:"for"`
	KeepFiringFor string            `yaml:"keep_firing_for"`
	Labels        map[string]string `yaml:"labels"`
	Annotations   map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T, data []byte) ruleFile {
	t.Helper()
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("%s: %v", alertsFile, err)
	}
	return rf
}

type dashboard struct {
	UID           string                    `json:"uid"`
	Title         string                    `json:"title"`
	SchemaVersion int                       `json:"schemaVersion"`
	Templating    struct{ List []variable } `json:"templating"`
	Panels        []panel                   `json:"panels"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasourceRef  `json:"datasource"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int            `json:"id"`
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Datasource *datasourceRef `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []target `json:"targets"`
	Panels  []panel  `json:"panels"` // a collapsed row's panels
}

type target struct {
	Expr         string         `json:"expr"`
	LegendFormat string         `json:"legendFormat"`
	RefID        string         `json:"refId"`
	Datasource   *datasourceRef `json:"datasource"`
}

func loadDashboard(t *testing.T, data []byte) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ---------------------------------------------------------------------------
// Checks.

var (
	alertNameRE  = regexp.MustCompile(`^Sluice[A-Z][A-Za-z0-9]*$`)
	recordNameRE = regexp.MustCompile(`^sluice:[a-z0-9_]+:[a-z0-9_]+$`)
	labelsRefRE  = regexp.MustCompile(`\$labels\.([A-Za-z_][A-Za-z0-9_]*)`)
	legendRefRE  = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)
	variableRE   = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[^}]*)?\}|\$([A-Za-z0-9_]+)`)
	labelValsRE  = regexp.MustCompile(`^label_values\((.+),\s*([A-Za-z_][A-Za-z0-9_]*)\)$`)
)

var severities = map[string]bool{"critical": true, "warning": true, "info": true}

// checkRules checks a rule file against the catalog and the runbook anchors
// and returns every problem found, each naming its rule. It also returns
// the families each alert depends on (through recording rules too).
func checkRules(rf ruleFile, cat *catalog, anchors map[string]bool) (problems []string, alerted map[string]bool) {
	bad := func(where, format string, args ...any) {
		problems = append(problems, where+": "+fmt.Sprintf(format, args...))
	}
	alerted = map[string]bool{}
	// deps maps a recorded series to the exported families behind it.
	deps := map[string]map[string]bool{}
	depsOf := func(c checked) map[string]bool {
		out := map[string]bool{}
		for _, s := range c.selectors {
			if r, err := cat.resolve(s.name); err == nil && r.fam != nil {
				out[r.fam.name] = true
			}
			for f := range deps[s.name] {
				out[f] = true
			}
		}
		return out
	}
	if len(rf.Groups) == 0 {
		bad(alertsFile, "no rule groups")
	}
	groups, names := map[string]bool{}, map[string]bool{}
	for gi, g := range rf.Groups {
		gw := fmt.Sprintf("group %d (%s)", gi, g.Name)
		if g.Name == "" || groups[g.Name] {
			bad(gw, "group name empty or repeated")
		}
		groups[g.Name] = true
		if g.Interval != "" {
			if _, err := model.ParseDuration(g.Interval); err != nil {
				bad(gw, "interval: %v", err)
			}
		}
		if len(g.Rules) == 0 {
			bad(gw, "no rules")
		}
		for ri, r := range g.Rules {
			where := fmt.Sprintf("%s rule %d (%s%s)", gw, ri, r.Alert, r.Record)
			if (r.Alert == "") == (r.Record == "") {
				bad(where, "exactly one of alert and record must be set")
				continue
			}
			name := r.Alert + r.Record
			if names[name] {
				bad(where, "name used twice")
			}
			names[name] = true
			c := cat.check(r.Expr)
			for _, err := range c.errs {
				bad(where, "expr: %v", err)
			}
			if r.Record != "" {
				if !recordNameRE.MatchString(r.Record) {
					bad(where, "record name must be level:metric:operations, like sluice:x:rate5m")
				}
				if r.For != "" || len(r.Annotations) > 0 {
					bad(where, "a recording rule takes no for or annotations")
				}
				labels := map[string]bool{}
				if len(c.grouping) > 0 {
					for _, l := range c.grouping {
						labels[l] = true
					}
				} else {
					for l := range c.labels {
						labels[l] = true
					}
				}
				for l := range r.Labels {
					labels[l] = true
				}
				cat.recorded[r.Record] = labels
				deps[r.Record] = depsOf(c)
				var sources []string
				for _, sel := range c.selectors {
					if res, err := cat.resolve(sel.name); err == nil {
						for _, src := range res.sources {
							if !slices.Contains(sources, src) {
								sources = append(sources, src)
							}
						}
					}
				}
				cat.recordedSources[r.Record] = sources
				continue
			}
			if !alertNameRE.MatchString(r.Alert) {
				bad(where, "alert name must look like SluiceSomething")
			}
			if r.For == "" {
				bad(where, "for is missing (write 0m to fire at once)")
			} else if _, err := model.ParseDuration(r.For); err != nil {
				bad(where, "for: %v", err)
			}
			if r.KeepFiringFor != "" {
				if _, err := model.ParseDuration(r.KeepFiringFor); err != nil {
					bad(where, "keep_firing_for: %v", err)
				}
			}
			if !severities[r.Labels["severity"]] {
				bad(where, "labels.severity %q must be critical, warning or info", r.Labels["severity"])
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					bad(where, "annotations.%s is missing", a)
				}
			}
			if u := r.Annotations["runbook_url"]; u != "" {
				anchor, ok := strings.CutPrefix(u, runbookBase)
				switch {
				case !ok:
					bad(where, "runbook_url %q does not start with %s", u, runbookBase)
				case !anchors[anchor]:
					bad(where, "runbook_url anchor #%s is not a section of %s", anchor, operationsFile)
				}
			}
			for _, text := range r.Annotations {
				for _, m := range labelsRefRE.FindAllStringSubmatch(text, -1) {
					if c.labels != nil && !c.labels[m[1]] {
						bad(where, "annotation uses $labels.%s, which no selected series carries", m[1])
					}
				}
			}
			for f := range depsOf(c) {
				alerted[f] = true
			}
		}
	}
	return problems, alerted
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// checkDashboard checks the dashboard against the catalog (with the
// recorded series of the rule file) and returns every problem and the
// families its panels show.
func checkDashboard(d dashboard, cat *catalog) (problems []string, shown map[string]bool) {
	bad := func(where, format string, args ...any) {
		problems = append(problems, where+": "+fmt.Sprintf(format, args...))
	}
	shown = map[string]bool{}
	if d.UID == "" || d.Title == "" {
		bad(dashboardFile, "uid and title are required")
	}
	if d.SchemaVersion < 36 {
		bad(dashboardFile, "schemaVersion %d is older than Grafana 9 (36)", d.SchemaVersion)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		where := "variable " + v.Name
		if vars[v.Name] {
			bad(where, "defined twice")
		}
		vars[v.Name] = true
		switch v.Type {
		case "datasource":
			var q string
			if json.Unmarshal(v.Query, &q) != nil || q != "prometheus" {
				bad(where, "a datasource variable must select prometheus")
			}
		case "query":
			var q string
			if err := json.Unmarshal(v.Query, &q); err != nil {
				var obj struct{ Query string }
				if err := json.Unmarshal(v.Query, &obj); err != nil {
					bad(where, "query is neither a string nor an object with query")
				}
				q = obj.Query
			}
			m := labelValsRE.FindStringSubmatch(strings.TrimSpace(q))
			if m == nil {
				bad(where, "query %q is not label_values(selector, label)", q)
				continue
			}
			c := cat.check(m[1])
			for _, err := range c.errs {
				bad(where, "%v", err)
			}
			if c.labels != nil && !c.labels[m[2]] {
				bad(where, "label %q is not a label of %s", m[2], m[1])
			}
			if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
				bad(where, "datasource must be ${datasource}")
			}
		}
	}
	if !vars["datasource"] {
		bad(dashboardFile, "no datasource variable")
	}
	ids := map[int]string{}
	for _, p := range allPanels(d.Panels) {
		where := fmt.Sprintf("panel %d (%s)", p.ID, p.Title)
		if p.ID <= 0 {
			bad(where, "panel id must be positive")
		}
		if other, ok := ids[p.ID]; ok {
			bad(where, "id also used by panel %q", other)
		}
		ids[p.ID] = p.Title
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X < 0 || p.GridPos.X+p.GridPos.W > 24 {
			bad(where, "gridPos %+v does not fit the 24-column grid", p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Title == "" {
			bad(where, "no title")
		}
		if len(p.Targets) == 0 {
			bad(where, "no targets")
		}
		refs := map[string]bool{}
		for ti, tg := range p.Targets {
			tw := fmt.Sprintf("%s target %d", where, ti)
			if tg.RefID == "" || refs[tg.RefID] {
				bad(tw, "refId %q empty or repeated", tg.RefID)
			}
			refs[tg.RefID] = true
			ds := tg.Datasource
			if ds == nil {
				ds = p.Datasource
			}
			if ds == nil || ds.UID != "${datasource}" {
				bad(tw, "datasource must be ${datasource}")
			}
			for _, m := range variableRE.FindAllStringSubmatch(tg.Expr, -1) {
				name := m[1] + m[2]
				if !strings.HasPrefix(name, "__") && !vars[name] {
					bad(tw, "uses variable $%s, which the dashboard does not define", name)
				}
			}
			c := cat.check(tg.Expr)
			for _, err := range c.errs {
				bad(tw, "%v", err)
			}
			for _, m := range legendRefRE.FindAllStringSubmatch(tg.LegendFormat, -1) {
				if c.labels != nil && !c.labels[m[1]] {
					bad(tw, "legend uses {{%s}}, which no selected series carries", m[1])
				}
			}
			for _, s := range c.selectors {
				if r, err := cat.resolve(s.name); err == nil && r.fam != nil {
					shown[r.fam.name] = true
				}
			}
		}
	}
	return problems, shown
}

// anchorsOf lists the link targets of a Markdown file the way GitHub
// renders it: heading slugs (with -1, -2 for repeats) and explicit
// <a id=...> / <a name=...> anchors.
func anchorsOf(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	explicit := regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range explicit.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		level := 0
		for level < len(line) && line[level] == '#' {
			level++
		}
		if level == 0 || level > 6 || level >= len(line) || line[level] != ' ' {
			continue
		}
		slug := slugify(line[level+1:])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// slugify is GitHub's heading anchor: lower case, punctuation dropped,
// spaces turned into hyphens.
func slugify(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func reportProblems(t *testing.T, what string, problems []string) {
	t.Helper()
	sort.Strings(problems)
	for _, p := range problems {
		t.Errorf("%s: %s", what, p)
	}
}

// ---------------------------------------------------------------------------
// Tests.

// TestCatalogListsEveryComponent guards the collection itself: a component
// whose metrics could not be listed would make every later check vacuous.
func TestCatalogListsEveryComponent(t *testing.T) {
	cat := exportedFamilies(t)
	for _, prefix := range []string{"sluice_regional_", "sluice_client_", "sluice_config_", "sluice_global_", "sluice_envoy_"} {
		n := 0
		for name := range cat.families {
			if strings.HasPrefix(name, prefix) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("no %s* family was collected", prefix)
		}
	}
	for _, want := range []struct{ name, kind, label string }{
		{"sluice_regional_lua_duration_seconds", "histogram", "script"},
		{"sluice_regional_decisions_total", "counter", "result"},
		{"sluice_client_degraded", "gauge", ""},
		{"sluice_client_degraded_episodes_total", "counter", ""},
		{"sluice_global_region_report_age_seconds", "gauge", "region"},
		{"sluice_global_allocation_seconds", "histogram", ""},
		{"sluice_global_config_history_failed_total", "counter", ""},
		{"sluice_envoy_request_duration_seconds", "histogram", "result"},
		{"sluice_config_rejected_total", "counter", ""},
		{"sluice_config_stored_refused", "gauge", ""},
	} {
		f, ok := cat.families[want.name]
		switch {
		case !ok:
			t.Errorf("%s not collected", want.name)
		case f.kind != want.kind:
			t.Errorf("%s collected as %q, want %s", want.name, f.kind, want.kind)
		case want.label != "" && !f.labels[want.label]:
			t.Errorf("%s lacks label %s: %s", want.name, want.label, sortedKeys(f.labels))
		}
	}
	var names []string
	for name, f := range cat.families {
		names = append(names, fmt.Sprintf("%s %s %s", name, f.kind, sortedKeys(f.labels)))
	}
	sort.Strings(names)
	t.Logf("%d families:\n%s", len(names), strings.Join(names, "\n"))
}

func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	return anchorsOf(string(readFile(t, operationsFile)))
}

func TestAlertRules(t *testing.T) {
	cat := exportedFamilies(t).fresh()
	rf := loadRules(t, readFile(t, alertsFile))
	problems, alerted := checkRules(rf, cat, runbookAnchors(t))
	reportProblems(t, alertsFile, problems)
	for _, f := range requiredAlerted {
		if !alerted[f] {
			t.Errorf("%s: no alert watches %s", alertsFile, f)
		}
	}
}

func TestDashboard(t *testing.T) {
	cat := exportedFamilies(t).fresh()
	rf := loadRules(t, readFile(t, alertsFile))
	// The dashboard may chart the series the rule file records.
	if problems, _ := checkRules(rf, cat, runbookAnchors(t)); len(problems) > 0 {
		t.Fatalf("%s has problems (see TestAlertRules)", alertsFile)
	}
	d := loadDashboard(t, readFile(t, dashboardFile))
	problems, shown := checkDashboard(d, cat)
	reportProblems(t, dashboardFile, problems)
	for _, f := range requiredPanels {
		if !shown[f] {
			t.Errorf("%s: no panel shows %s", dashboardFile, f)
		}
	}
	var unshown []string
	for name := range cat.families {
		if !shown[name] {
			unshown = append(unshown, name)
		}
	}
	sort.Strings(unshown)
	if len(unshown) > 0 {
		t.Logf("exported families no panel shows: %s", strings.Join(unshown, ", "))
	}
}

func TestRunbookHasEverySection(t *testing.T) {
	anchors := runbookAnchors(t)
	for _, a := range requiredRunbookSections {
		if !anchors[a] {
			t.Errorf("%s has no section #%s", operationsFile, a)
		}
	}
}

// TestChecksCatchMistakes breaks good rules and dashboards in the ways that
// matter and requires each break to be reported: the checks above are only
// worth something if they can fail.
func TestChecksCatchMistakes(t *testing.T) {
	cat := exportedFamilies(t)
	anchors := map[string]bool{"x": true}
	good := rule{
		Alert: "SluiceExample", For: "5m", Labels: map[string]string{"severity": "warning"},
		Expr: `sum by (namespace, script) (rate(sluice_regional_redis_errors_total{script="check"}[5m])) > 0`,
		Annotations: map[string]string{
			"summary": "{{ $labels.script }}", "description": "d", "runbook_url": runbookBase + "x",
		},
	}
	check := func(r rule) []string {
		// Each check gets its own recorded map so cases do not leak.
		c := cat.fresh()
		p, _ := checkRules(ruleFile{Groups: []ruleGroup{{Name: "g", Rules: []rule{r}}}}, c, anchors)
		return p
	}
	if p := check(good); len(p) > 0 {
		t.Fatalf("the good rule is refused: %v", p)
	}
	cases := []struct {
		name string
		edit func(*rule)
		want string
	}{
		{"misspelt metric", func(r *rule) {
			r.Expr = strings.Replace(r.Expr, "redis_errors", "redis_error", 1)
		}, "not exported by any component"},
		{"metric only in a string", func(r *rule) {
			r.Expr = `vector(1) > 0 # sluice_regional_redis_errors_total`
		}, "selects no series"},
		{"unknown label in matcher", func(r *rule) {
			r.Expr = strings.Replace(r.Expr, `script="check"`, `region="x"`, 1)
		}, `no label "region"`},
		{"label value no code writes", func(r *rule) {
			r.Expr = strings.Replace(r.Expr, `script="check"`, `script="chek"`, 1)
		}, `writes the value "chek"`},
		{"label value in a list no code writes", func(r *rule) {
			r.Expr = `sum(rate(sluice_regional_requests_total{code=~"OK|Unavailible"}[5m])) > 0`
		}, `writes the value "Unavailible"`},
		{"label value through a recording rule", func(r *rule) {
			r.Expr = `sum(rate(sluice_client_decisions_total{result="deny"}[5m])) > 0`
		}, `writes the value "deny"`},
		{"unknown grouping label", func(r *rule) {
			r.Expr = strings.Replace(r.Expr, "by (namespace, script)", "by (tenant)", 1)
		}, `grouping by "tenant"`},
		{"histogram without suffix", func(r *rule) {
			r.Expr = `rate(sluice_regional_lua_duration_seconds[5m]) > 0`
		}, "is a histogram"},
		{"bucket of a counter", func(r *rule) {
			r.Expr = `rate(sluice_regional_redis_errors_total_bucket[5m]) > 0`
		}, "is a counter"},
		{"histogram_quantile without buckets", func(r *rule) {
			r.Expr = `histogram_quantile(0.99, rate(sluice_regional_lua_duration_seconds_count[5m])) > 0`
		}, "without a _bucket"},
		{"rate of a gauge", func(r *rule) {
			r.Expr = `rate(sluice_client_degraded[5m]) > 0`
		}, "not a counter"},
		{"unknown function", func(r *rule) { r.Expr = strings.Replace(r.Expr, "rate(", "rat(", 1) }, "unknown function"},
		{"unbalanced parenthesis", func(r *rule) { r.Expr += ")" }, "unexpected right parenthesis"},
		{"unterminated string", func(r *rule) { r.Expr = strings.Replace(r.Expr, `"check"`, `"check`, 1) }, "unterminated"},
		{"missing severity", func(r *rule) { r.Labels = nil }, "severity"},
		{"missing summary", func(r *rule) { delete(r.Annotations, "summary") }, "summary is missing"},
		{"runbook anchor missing", func(r *rule) { r.Annotations["runbook_url"] = runbookBase + "nowhere" }, "#nowhere"},
		{"runbook elsewhere", func(r *rule) { r.Annotations["runbook_url"] = "https://example.com/#x" }, "does not start with"},
		{"annotation label not carried", func(r *rule) { r.Annotations["summary"] = "{{ $labels.tenant }}" }, "$labels.tenant"},
		{"bad for", func(r *rule) { r.For = "5 minutes" }, "for:"},
		{"no for", func(r *rule) { r.For = "" }, "for is missing"},
		{"bad alert name", func(r *rule) { r.Alert = "redis errors" }, "alert name"},
	}
	for _, tc := range cases {
		r := good
		r.Labels = map[string]string{"severity": "warning"}
		r.Annotations = map[string]string{}
		for k, v := range good.Annotations {
			r.Annotations[k] = v
		}
		tc.edit(&r)
		p := check(r)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%s: want a problem mentioning %q, got %q", tc.name, tc.want, p)
		}
	}

	// The shipped files, each with one mistake written in.
	alerts := string(readFile(t, alertsFile))
	broken := strings.Replace(alerts, "sluice_global_leader", "sluice_global_leaders", 1)
	if broken == alerts {
		t.Fatal("alerts.yaml no longer mentions sluice_global_leader")
	}
	c := cat.fresh()
	p, _ := checkRules(loadRules(t, []byte(broken)), c, runbookAnchors(t))
	if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, "sluice_global_leaders is not exported") }) {
		t.Errorf("a misspelt metric in alerts.yaml passes: %q", p)
	}

	dash := loadDashboard(t, readFile(t, dashboardFile))
	c = cat.fresh()
	checkRules(loadRules(t, readFile(t, alertsFile)), c, runbookAnchors(t))
	for _, tc := range []struct {
		name string
		edit func(*dashboard)
		want string
	}{
		{"repeated panel id", func(d *dashboard) { d.Panels[2].ID = d.Panels[1].ID }, "id also used"},
		{"panel without targets", func(d *dashboard) { d.Panels[1].Targets = nil }, "no targets"},
		{"undefined variable", func(d *dashboard) {
			d.Panels[1].Targets = []target{{RefID: "A", Expr: `sum(sluice_client_degraded{job=~"$app"})`}}
		}, "variable $app"},
		{"misspelt metric", func(d *dashboard) {
			d.Panels[1].Targets = []target{{RefID: "A", Expr: `sum(sluice_client_degradedd)`}}
		}, "not exported"},
		{"legend label not carried", func(d *dashboard) {
			d.Panels[1].Targets = []target{{RefID: "A", Expr: `sum(sluice_client_degraded)`, LegendFormat: "{{pod}} {{class}}"}}
		}, "{{class}}"},
		{"wrong datasource", func(d *dashboard) {
			d.Panels[1].Datasource = &datasourceRef{UID: "prom-1"}
			for i := range d.Panels[1].Targets {
				d.Panels[1].Targets[i].Datasource = nil
			}
		}, "${datasource}"},
	} {
		var d dashboard
		if err := json.Unmarshal(readFile(t, dashboardFile), &d); err != nil {
			t.Fatal(err)
		}
		tc.edit(&d)
		p, _ := checkDashboard(d, c)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("dashboard %s: want a problem mentioning %q, got %q", tc.name, tc.want, p)
		}
	}
	if p, _ := checkDashboard(dash, c); len(p) > 0 {
		t.Errorf("the shipped dashboard has problems: %q", p)
	}
}

func TestParseFindsSelectorsAndGrouping(t *testing.T) {
	p, err := parse(`histogram_quantile(0.99, sum by (script, le) (rate(a_bucket{x="sluice_not_a_metric", y=~"$v"}[$__rate_interval])))
		/ on (script) group_left sum without (pod) (b) # c_in_a_comment
		and max(d offset 1h) > bool 2 unless max_over_time(e[1h:5m]) or topk(3, f)`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range p.selectors {
		got = append(got, fmt.Sprintf("%s%v@%s", s.name, s.matchers, s.fn))
	}
	want := []string{"a_bucket[{x = sluice_not_a_metric} {y =~ $v}]@rate", "b[]@sum", "d[]@max", "e[]@max_over_time", "f[]@topk"}
	if !slices.Equal(got, want) {
		t.Errorf("selectors %q, want %q", got, want)
	}
	grouping := slices.Clone(p.grouping)
	slices.Sort(grouping)
	if !slices.Equal(grouping, []string{"le", "pod", "script", "script"}) {
		t.Errorf("grouping %q", p.grouping)
	}
	for _, bad := range []string{``, `{job="x"}`, `sum(x`, `x and y[5m]`, `rate(x)`, `x}`, `rate(x[5m]`, `x[5m`, `sum by (a`, `x{a=}`, `x{="b"}`, `sum by (a)`, `"x`} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
}

func TestParseDesc(t *testing.T) {
	d := prometheus.NewDesc("sluice_x_total", `help with "quotes", variableLabels: {fake}}`,
		[]string{"a", "b"}, prometheus.Labels{"c": `v,"}`, "d": "w"})
	got, err := parseDesc(d.String())
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(got.labels)
	if got.name != "sluice_x_total" || !slices.Equal(got.labels, []string{"a", "b", "c", "d"}) {
		t.Errorf("parseDesc(%s) = %+v", d.String(), got)
	}
}

func TestAnchors(t *testing.T) {
	got := anchorsOf("# Title\n## Deny ratio high\n## Redis: restarted `empty`!\n## Deny ratio high\n```\n## not a heading\n```\n<a id=\"extra\"></a>\n")
	for _, want := range []string{"title", "deny-ratio-high", "redis-restarted-empty", "deny-ratio-high-1", "extra"} {
		if !got[want] {
			t.Errorf("anchor %q missing from %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a heading inside a code fence became an anchor")
	}
}
