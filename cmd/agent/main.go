// Command agent is the local Sluice agent, run as a sidecar beside an
// application or as one pod per node: it embeds the lease client, leases
// tokens from the region's regional service (-region-addr), and answers on
// localhost from those tokens in memory, with no network hop per request:
//
//   - Envoy's rate limit service (gRPC, -listen), for Envoy sidecars;
//   - POST /v1/allow (HTTP/JSON, -http-listen), for services in any
//     language;
//   - /metrics, /healthz and /livez (-metrics-listen).
//
// Config: from etcd (-etcd-endpoints; hot-reloaded, as the regional
// service reads it) or from a file (-config). The agent only reads the
// config; it needs the same one as its region.
//
// Every flag can also be set from the environment: -region-addr from
// SLUICE_REGION_ADDR, and so on (the command line wins). SIGTERM stops
// answering, lets requests in flight finish and releases the unspent
// tokens to the region.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/etcdflags"
	"github.com/sluicehq/sluice/internal/flagenv"
	"github.com/sluicehq/sluice/internal/stopsignal"
	"github.com/sluicehq/sluice/internal/version"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/rpcguard"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the usage went to stderr
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "agent: ") {
			msg = "agent: " + msg
		}
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}
}

// flags are the command's settings; see parseFlags for their meaning.
type flags struct {
	regionAddr, region               string
	grpcAddr, httpAddr, metricsAddr  string
	configFile, logLevel             string
	etcdEndpoints, etcdPrefix        string
	etcd                             etcdflags.Access
	tlsCA, tlsCert, tlsKey, instance string
	breakerTimeout, configWait       time.Duration
	perConnection                    int
	envoyHeaders, version            bool
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.StringVar(&f.regionAddr, "region-addr", "", "the region's regional service (LeaseService): host:port, its replicas as host:port,host:port,... (round-robin), or a gRPC target such as dns:///sluice-regional-headless.sluice:7400 (required)")
	fs.StringVar(&f.region, "region", "", `the region -region-addr serves, as the config names it: a key the region never answered this agent for runs its local on_failure policy, while the region is out of reach, within that region's static share of the key's limit ("", or a region the config does not name: the largest static share of any region)`)
	fs.StringVar(&f.grpcAddr, "listen", agent.DefaultGRPCAddr, "gRPC listen address (Envoy RateLimitService, health, reflection)")
	fs.StringVar(&f.httpAddr, "http-listen", agent.DefaultHTTPAddr, `HTTP listen address of POST /v1/allow ("off" disables)`)
	fs.StringVar(&f.metricsAddr, "metrics-listen", agent.DefaultMetricsAddr, `HTTP listen address for /metrics, /healthz and /livez ("off" disables)`)
	fs.StringVar(&f.configFile, "config", "", "config file (YAML), for an agent without etcd; the region's config")
	fs.StringVar(&f.etcdEndpoints, "etcd-endpoints", "", "etcd endpoints, comma separated: the config from etcd, hot-reloaded (instead of -config)")
	fs.StringVar(&f.etcdPrefix, "etcd-prefix", config.DefaultPrefix, "etcd key prefix of the config")
	fs.DurationVar(&f.configWait, "config-wait", 5*time.Second, "with etcd: how long to wait at start for the config before serving anyway (answering 503 until it comes)")
	fs.StringVar(&f.instance, "instance-id", "", "id this agent reports to the region under (default agent-<host>-<pid>.<random>); must not be shared by two live processes")
	fs.DurationVar(&f.breakerTimeout, "breaker-timeout", lease.DefaultBreakerTimeout, "bound on a decision's wait for the region (a key without tokens), after which the class's on_failure policy decides. Behind Envoy's rate-limit filter set it below the filter's timeout (20ms by default; e.g. 15ms), or Envoy gives up first and its failure_mode_deny decides instead")
	fs.BoolVar(&f.envoyHeaders, "envoy-headers", true, "add x-ratelimit-*, ratelimit, ratelimit-policy and retry-after headers to Envoy rate limit answers")
	fs.IntVar(&f.perConnection, "max-inflight-per-connection", rpcguard.DefaultPerConnection, "units of work (descriptors named by the Envoy calls) served at once per client connection; more wait their turn (docs/operations.md, Request bounds)")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA bundle (PEM) to verify the regional service with; enables TLS to it")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "client certificate (PEM) towards the regional service (mutual TLS)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "client private key (PEM)")
	f.etcd.Register(fs)
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&f.version, flagenv.VersionFlag, false, "print the version and exit")
	flagenv.Usage(fs, "SLUICE")
	if err := flagenv.Parse(fs, "SLUICE", args, os.Getenv); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	// Values the agent would refuse in the words of its options are
	// refused here naming the flag.
	switch {
	case f.breakerTimeout <= 0:
		return nil, fmt.Errorf("-breaker-timeout %v must be positive", f.breakerTimeout)
	case f.perConnection < envoyrls.MaxDescriptors:
		return nil, fmt.Errorf("-max-inflight-per-connection %d must be at least %d, the descriptors one Envoy request may name, or such a request could never be served",
			f.perConnection, envoyrls.MaxDescriptors)
	case f.configWait < 0:
		return nil, fmt.Errorf("-config-wait %v must not be negative", f.configWait)
	}
	return f, nil
}

func run(ctx context.Context, args []string, stdout *os.File) error {
	f, err := parseFlags(args)
	if err != nil {
		return err
	}
	if f.version {
		fmt.Fprintln(stdout, version.String("agent"))
		return nil
	}
	logger, err := flagenv.Logger(f.logLevel)
	if err != nil {
		return err
	}
	if f.regionAddr == "" {
		return errors.New("-region-addr is required: the address of the region's regional service")
	}
	eps := flagenv.List(f.etcdEndpoints)
	switch {
	case len(eps) == 0 && f.configFile == "":
		return errors.New("no config: pass -etcd-endpoints (the config from etcd) or -config FILE")
	case len(eps) > 0 && f.configFile != "":
		return errors.New("-config and -etcd-endpoints are exclusive: the config comes from one place")
	}
	tlsCfg, err := tlsconfig.Client(f.tlsCA, f.tlsCert, f.tlsKey, "", tlsconfig.WithLogger(logger))
	if err != nil {
		return fmt.Errorf("region TLS: %w", err)
	}
	var creds credentials.TransportCredentials
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}

	ctx, stop := stopsignal.NotifyContext(ctx)
	defer stop()

	reg := prometheus.NewRegistry()
	var source agent.ConfigSource
	if f.configFile != "" {
		cfg, err := loadConfig(f.configFile)
		if err != nil {
			return err
		}
		source = agent.StaticConfig{C: cfg}
	} else {
		cli, err := f.etcd.Client(eps)
		if err != nil {
			return err
		}
		defer cli.Close()
		store := configstore.NewStore(cli, f.etcdPrefix)
		// The watcher's fallback is never served: agent.Watched answers
		// that no config is loaded until etcd's is live.
		watcher := configstore.NewWatcher(store, nil, logger, reg)
		watchCtx, stopWatch := context.WithCancel(context.Background())
		watchDone := make(chan struct{})
		go func() { watcher.Run(watchCtx); close(watchDone) }()
		defer func() { stopWatch(); <-watchDone }()
		// A config stored in etcd that is refused (written past sluicectl)
		// would leave the agent without one: start on the newest valid
		// config in etcd's history, the one the running daemons kept.
		historyDone, noConfig := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(historyDone)
			if err := configstore.StartOnHistory(watchCtx, store, watcher, logger); err != nil && watchCtx.Err() == nil {
				logger.Error("the config stored in etcd is refused and etcd's history holds no valid one: serving without a config, "+noConfigAnswers+", until a good one is applied with sluicectl apply",
					"key", store.Key(), "error", err)
				close(noConfig)
			}
		}()
		defer func() { stopWatch(); <-historyDone }()
		source = agent.Watched{W: watcher}
		waitConfig(ctx, watcher, noConfig, cli, store.Key(), f.configWait, logger)
		if ctx.Err() != nil {
			// A stop requested while waiting for etcd is a clean stop:
			// it neither binds the ports nor says it started.
			logger.Info("stopped before start: etcd's config was still awaited")
			return nil
		}
	}

	a, err := agent.Start(agent.Options{
		RegionAddr: f.regionAddr, Region: f.region, RegionCreds: creds,
		GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr, MetricsAddr: f.metricsAddr,
		Config: source, EnvoyHeaders: &f.envoyHeaders, Registry: reg, Logger: logger,
		PerConnection: f.perConnection,
		Lease:         lease.Options{InstanceID: f.instance, BreakerTimeout: f.breakerTimeout},
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	logger.Info("shutting down: draining, then releasing leased tokens")
	a.Stop()
	return nil
}

// noConfigAnswers is what the agent answers while no config is live.
const noConfigAnswers = "answering 503 (HTTP) and UNAVAILABLE (gRPC), not ready"

// waitConfig waits up to max for the watcher's first config from etcd,
// so the lease client starts with the config's refresh and classes, or
// until noConfig is closed (none can come before a good one is applied,
// which has been said). When none is live by max, it says why, as far as
// one read of the config key within the wait tells (etcd answered and
// holds no config, holds one not made live, or did not answer), and what
// the agent does meanwhile: it serves, with no config (never the
// watcher's fallback), answering 503 and UNAVAILABLE and not ready, until
// one is live.
func waitConfig(ctx context.Context, w *configstore.Watcher, noConfig <-chan struct{}, cli *clientv3.Client, key string, max time.Duration, logger *slog.Logger) {
	updates, cancel := w.Subscribe()
	defer cancel()
	if w.Revision() > 0 {
		return
	}
	if max == 0 {
		logger.Warn("not waiting for etcd's config (-config-wait 0): serving without one, "+noConfigAnswers+", until it is live", "key", key)
		return
	}
	waitCtx, stop := context.WithTimeout(ctx, max)
	defer stop()
	type answer struct {
		resp *clientv3.GetResponse
		err  error
	}
	read := make(chan answer, 1)
	go func() {
		resp, err := cli.Get(waitCtx, key, clientv3.WithKeysOnly())
		read <- answer{resp, err}
	}()
	select {
	case <-updates:
	case <-waitCtx.Done():
	case <-noConfig:
	}
	stop()
	got := <-read
	if ctx.Err() != nil || w.Revision() > 0 {
		return
	}
	select {
	case <-noConfig:
		return
	default:
	}
	switch {
	case errors.Is(got.err, context.DeadlineExceeded):
		logger.Warn("etcd not reachable: serving without a config, "+noConfigAnswers+", until etcd answers with one; the config watch keeps trying",
			"key", key, "waited", max, "error", fmt.Sprintf("no answer within %v (-config-wait)", max))
	case got.err != nil:
		logger.Warn("reading the config from etcd failed: serving without one, "+noConfigAnswers+", until etcd answers with one; the config watch keeps trying",
			"key", key, "waited", max, "error", got.err)
	case len(got.resp.Kvs) == 0:
		logger.Warn("etcd holds no config: serving without one, "+noConfigAnswers+", until one is applied with sluicectl apply",
			"key", key, "waited", max)
	default:
		// A refused config is logged by the watcher; one that is valid
		// was not read in full within the wait.
		logger.Warn("etcd holds a config that is not live yet: serving without one, "+noConfigAnswers+", until it is (a refused config is logged at ERROR: apply a good one with sluicectl apply)",
			"key", key, "revision", got.resp.Kvs[0].ModRevision, "waited", max)
	}
}

func loadConfig(file string) (*config.Config, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	cfg, err := config.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", file, err)
	}
	return cfg, nil
}
