// Command regional is Sluice's regional service: it keeps the region's
// share of every quota as token buckets in the region's Redis, leases
// batches of tokens to application instances over gRPC, answers Envoy's
// rate limit service from leases it holds itself, and — on the replica
// elected region leader — reports demand to the global allocator and
// installs its grants.
//
// Config: from etcd (-etcd-endpoints; hot-reloaded, invalid configs are
// refused) or from a file (-config) for development; the built-in sample
// when neither is given.
//
// -dev runs a whole self-contained deployment in this process instead:
// embedded etcd, a global allocator and every region of the config, each
// with its own Redis, serving the LeaseService, the Envoy rate limit
// service and reflection; it prints what runs where and an example per API.
//
// Every flag can also be set from the environment: -redis-addr from
// SLUICE_REDIS_ADDR, and so on (the command line wins).
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/reflection"

	"github.com/sluicehq/sluice/internal/devcluster"
	"github.com/sluicehq/sluice/internal/etcdflags"
	"github.com/sluicehq/sluice/internal/flagenv"
	"github.com/sluicehq/sluice/internal/stopsignal"
	"github.com/sluicehq/sluice/internal/version"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
	"github.com/sluicehq/sluice/pkg/rpcguard"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the usage went to stderr
		}
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}

// errorLine is the message of a failed run, prefixed with the command's
// name once (errors from pkg/regional already carry it).
func errorLine(err error) string {
	msg := err.Error()
	if !strings.HasPrefix(msg, "regional: ") {
		msg = "regional: " + msg
	}
	return msg
}

// flags are the command's settings; see register for their meaning.
type flags struct {
	dev                                 bool
	region, grpcAddr, httpAddr          string
	redisAddr, redisPassword            string
	redisUsername                       string
	redisTLS                            bool
	redisTLSCA, redisTLSCert            string
	redisTLSKey, redisTLSName           string
	redisCluster, redisAllowEviction    bool
	configFile, coldStart, logLevel     string
	etcdEndpoints, etcdPrefix           string
	globalAddrs                         string
	sessionTTL                          time.Duration
	envoyHeaders, unleased              bool
	tlsCert, tlsKey, tlsClientCA, tlsCA string
	etcd                                etcdflags.Access
	perConnection, perIdentity          int
	globalTLSName                       string
	version                             bool
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("regional", flag.ContinueOnError)
	fs.BoolVar(&f.dev, "dev", false, "run a self-contained deployment in this process (embedded etcd, a global allocator, every region of the config with its own Redis; -listen and -metrics-listen place the -region region) and print what runs where with an example call per API")
	fs.StringVar(&f.region, "region", "us-east", "region this service serves (must be in the config)")
	fs.StringVar(&f.grpcAddr, "listen", "127.0.0.1:7400", "gRPC listen address (LeaseService, Envoy RateLimitService, health)")
	fs.StringVar(&f.httpAddr, "metrics-listen", "127.0.0.1:7401", `HTTP listen address for /metrics, /healthz and /livez ("off" disables)`)
	fs.StringVar(&f.redisAddr, "redis-addr", "127.0.0.1:6379", "the region's Redis (host:port); several comma-separated addresses mean a Redis Cluster")
	fs.BoolVar(&f.redisCluster, "redis-cluster", false, "treat a single -redis-addr as a Redis Cluster endpoint")
	fs.StringVar(&f.redisUsername, "redis-username", "", "Redis ACL user to authenticate as (with -redis-password); empty = the default user. docs/operations.md has the least-privilege ACL")
	fs.StringVar(&f.redisPassword, "redis-password", "", "Redis password (of -redis-username, else of the default user); never logged")
	fs.BoolVar(&f.redisTLS, "redis-tls", false, "connect to Redis over TLS, verifying its certificate with the system roots unless -redis-tls-ca; any -redis-tls-* flag implies it")
	fs.StringVar(&f.redisTLSCA, "redis-tls-ca", "", "CA bundle (PEM) to verify Redis's certificate; enables TLS to Redis")
	fs.StringVar(&f.redisTLSCert, "redis-tls-cert", "", "client certificate (PEM) to present to Redis (for tls-auth-clients); needs -redis-tls-key; enables TLS to Redis")
	fs.StringVar(&f.redisTLSKey, "redis-tls-key", "", "private key (PEM) of -redis-tls-cert")
	fs.StringVar(&f.redisTLSName, "redis-tls-name", "", "name Redis's certificate must carry (default: the host of each -redis-addr; set it when the certificate names the service and the address is an IP); enables TLS to Redis")
	fs.BoolVar(&f.redisAllowEviction, "redis-allow-eviction", false, "start on a Redis whose maxmemory-policy may evict keys (maxmemory set, a policy other than noeviction), refused without it: an evicted token bucket comes back full, so the region admits more than its limit, by up to a burst per eviction (gives up invariant 1; docs/operations.md, Redis evicts keys)")
	fs.StringVar(&f.configFile, "config", "", "config file (YAML): the config without etcd, the bootstrap written to etcd when it holds none; empty = the built-in sample")
	fs.StringVar(&f.coldStart, "cold-start", "conservative", `how a Redis with no Sluice data is treated at this process's start: "conservative" (new buckets start empty for the longer of one lease TTL and one grant validity plus one epoch) or "full" (a fresh deployment whose Redis never held leases: buckets start full); a Redis that loses its data while the process runs is always treated conservatively`)
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.etcdEndpoints, "etcd-endpoints", "", "etcd endpoints, comma separated (config from etcd, region leader election); empty = no etcd")
	fs.StringVar(&f.etcdPrefix, "etcd-prefix", config.DefaultPrefix, "etcd key prefix of the config and elections")
	fs.StringVar(&f.globalAddrs, "global-addr", "", "global allocator address(es), comma separated; with etcd, makes this replica a candidate for region leader. With global_shards above 1, \"{shard}\" in an address stands for the shard's number (sluice-global-{shard}:7500), one client per shard; without it every address serves shard 0 only")
	fs.BoolVar(&f.unleased, "unleased", false, "a region with no global tier at all: run on the static shares unconditionally (refused with -global-addr); without it a region whose leader holds no static lease from the global tier runs on its floor")
	fs.DurationVar(&f.sessionTTL, "session-ttl", 5*time.Second, "etcd session TTL of the region leader election")
	fs.BoolVar(&f.envoyHeaders, "envoy-headers", true, "add x-ratelimit-*, ratelimit, ratelimit-policy and retry-after headers to Envoy rate limit answers")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "server certificate (PEM) for gRPC; enables TLS (also the client certificate towards the global tier)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "server private key (PEM)")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "CA bundle (PEM) client certificates must chain to; enables mutual TLS")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "CA bundle (PEM) to verify the global tier and this service's own certificate")
	fs.StringVar(&f.globalTLSName, "global-tls-name", "", "name the global tier's certificate must carry (default: the dialed host; set it when the leader's address is an IP, as -advertise=$(POD_IP):7500 makes it)")
	f.etcd.Register(fs)
	fs.IntVar(&f.perConnection, "max-inflight-per-connection", rpcguard.DefaultPerConnection, "units of work (keys named by the calls) served at once per client connection; more wait their turn (docs/operations.md, Request bounds)")
	fs.IntVar(&f.perIdentity, "max-inflight-per-identity", rpcguard.DefaultPerIdentity, "units of work served at once per client certificate identity over all its connections (mutual TLS only)")
	fs.BoolVar(&f.version, flagenv.VersionFlag, false, "print the version and exit")
	flagenv.Usage(fs, "SLUICE")
	if err := flagenv.Parse(fs, "SLUICE", args, os.Getenv); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := regional.ValidateRedisAddr(f.redisAddr); err != nil {
		return nil, fmt.Errorf("-redis-addr wants host:port (comma-separated for a Redis Cluster): %w", err)
	}
	for _, addr := range flagenv.List(f.globalAddrs) {
		if err := checkGlobalAddr(addr); err != nil {
			return nil, fmt.Errorf("-global-addr wants host:port, comma separated (\"{shard}\" may stand for the shard's number): %q: %v", addr, err)
		}
	}
	// Values the service would refuse in the words of its options are
	// refused here naming the flag.
	switch {
	case f.redisAddr == "":
		return nil, errors.New("-redis-addr is required (host:port)")
	case f.redisUsername != "" && f.redisPassword == "":
		return nil, errors.New("-redis-username needs -redis-password")
	case f.sessionTTL <= 0:
		return nil, fmt.Errorf("-session-ttl %v must be positive", f.sessionTTL)
	case f.perConnection < 1:
		return nil, fmt.Errorf("-max-inflight-per-connection %d must be at least 1", f.perConnection)
	case f.perIdentity < f.perConnection:
		return nil, fmt.Errorf("-max-inflight-per-identity %d must be at least -max-inflight-per-connection (%d)", f.perIdentity, f.perConnection)
	}
	return f, nil
}

// checkGlobalAddr says why addr, one of -global-addr's, is not an address
// the region leader can dial (nil when it is): host:port once "{shard}"
// stands for a number, or a target of a registered gRPC scheme
// (dns:///host:port). Unchecked, a mistake surfaced only once the replica
// led its region, as sync failures, while the region ran on its grants,
// then on its floor.
func checkGlobalAddr(addr string) error {
	return flagenv.GRPCTarget(strings.ReplaceAll(addr, "{shard}", "0"))
}

func run(ctx context.Context, args []string, stdout *os.File) error {
	return runNotifying(ctx, args, stdout, nil)
}

// runNotifying is run that, once the service serves, calls started with
// its bound gRPC address (tests listen on :0 and learn the port this way,
// instead of racing other processes for a port they picked).
func runNotifying(ctx context.Context, args []string, stdout *os.File, started func(grpcAddr string)) error {
	f, err := parseFlags(args)
	if err != nil {
		return err
	}
	if f.version {
		fmt.Fprintln(stdout, version.String("regional"))
		return nil
	}
	logger, err := flagenv.Logger(f.logLevel)
	if err != nil {
		return err
	}
	// The Redis client library's own lines, structured and at DEBUG.
	regional.RouteRedisLogs(logger)
	cfg, err := loadConfig(f.configFile)
	if err != nil {
		return err
	}
	ctx, stop := stopsignal.NotifyContext(ctx)
	defer stop()
	if f.dev {
		// -listen and -metrics-listen place the -region region, the one
		// the printed examples call; the other regions take free ports.
		httpAddr := f.httpAddr
		if httpAddr == "off" {
			httpAddr = ""
		}
		return devcluster.RunDev(ctx, devcluster.DevOptions{Config: cfg, Region: f.region, Logger: logger, Out: stdout,
			Listen: devcluster.ListenAddrs{GRPC: f.grpcAddr, HTTP: httpAddr}})
	}
	sampleTenants := strings.Join(slices.Sorted(maps.Keys(cfg.Tenants)), ",")
	if f.configFile == "" && f.etcdEndpoints == "" {
		logger.Warn("no -config and no -etcd-endpoints: serving the built-in sample config and its sample tenants; pass -config FILE (or -etcd-endpoints) for your own", "tenants", sampleTenants)
	}
	cs, err := regional.ParseColdStart(f.coldStart)
	if err != nil {
		return err
	}
	serverTLS, err := tlsconfig.Server(f.tlsCert, f.tlsKey, f.tlsClientCA, tlsconfig.WithLogger(logger))
	if err != nil {
		return err
	}
	peerTLS, err := tlsconfig.Client(f.tlsCA, f.tlsCert, f.tlsKey, f.globalTLSName, tlsconfig.WithLogger(logger))
	if err != nil {
		return fmt.Errorf("peer TLS: %w", err)
	}
	redisTLS, err := redisTLSConfig(f, tlsconfig.WithLogger(logger))
	if err != nil {
		return err
	}
	peerCreds := insecure.NewCredentials()
	if peerTLS != nil {
		peerCreds = credentials.NewTLS(peerTLS)
	}

	reg := prometheus.NewRegistry()
	var source regional.ConfigSource = regional.StaticConfig{C: cfg}
	var leaderOpts *regional.LeaderOptions
	if eps := flagenv.List(f.etcdEndpoints); len(eps) > 0 {
		cli, err := f.etcd.Client(eps)
		if err != nil {
			return err
		}
		defer cli.Close()
		store := configstore.NewStore(cli, f.etcdPrefix)
		watcher := configstore.NewWatcher(store, cfg, logger, reg)
		watchCtx, stopWatch := context.WithCancel(context.Background())
		defer stopWatch()
		go watcher.Run(watchCtx)
		// Start on etcd's config, never on a fallback that differs from
		// it (whose regions may not even name this one).
		var bootstrap *config.Config
		if f.configFile != "" {
			bootstrap = cfg
		}
		rev, err := configstore.AwaitEtcdConfig(ctx, store, bootstrap, watcher, logger)
		if err != nil {
			if ctx.Err() != nil {
				// A stop requested while waiting for etcd is a clean stop.
				logger.Info("stopped before start: etcd's config was still awaited")
				return nil
			}
			return err
		}
		switch {
		case f.configFile != "":
		case rev == 0:
			logger.Warn("no -config and etcd holds no config: serving the built-in sample config and its sample tenants until one is applied; pass -config FILE to bootstrap your own", "tenants", sampleTenants)
		default:
			logger.Info("no -config: serving the config etcd holds", "revision", rev)
		}
		source = watcher
		if addrs := flagenv.List(f.globalAddrs); len(addrs) > 0 {
			tiers := newShardClients(addrs, grpc.WithTransportCredentials(peerCreds))
			defer tiers.Close()
			gc, err := tiers.tier(0)
			if err != nil {
				return err
			}
			leaderOpts = &regional.LeaderOptions{Etcd: cli, ElectionPrefix: store.ElectionPrefix(),
				Global: gc, Shards: tiers.tier, SessionTTL: f.sessionTTL}
		} else if !f.unleased {
			logger.Warn("no -global-addr: this replica never leads; the region runs on the static lease another replica's leader stores in Redis, else on its floor (-unleased for a region with no global tier)")
		}
	} else if f.globalAddrs != "" {
		return errors.New("-global-addr needs -etcd-endpoints (the region leader is elected in etcd)")
	}
	if f.unleased && leaderOpts != nil {
		return errors.New("-unleased is for a region with no global tier; it cannot be used with -global-addr")
	}
	if f.unleased {
		logger.Warn("-unleased: static shares are unconditional; never run it beside a global tier")
	} else if leaderOpts == nil && f.etcdEndpoints == "" {
		logger.Warn("no global tier: the region runs on its floor (partition_share of its static shares); -unleased runs a region with no global tier on its static shares")
	}

	envoy, err := envoyrls.New(envoyrls.Options{Config: source, Registerer: reg, Logger: logger, Headers: &f.envoyHeaders})
	if err != nil {
		return err
	}
	d, err := regional.StartDaemon(ctx, regional.DaemonOptions{
		Region: f.region, GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr,
		RedisAddr: f.redisAddr, RedisCluster: f.redisCluster,
		RedisUsername: f.redisUsername, RedisPassword: f.redisPassword, RedisTLS: redisTLS,
		AllowEviction: f.redisAllowEviction,
		Config:        source, ColdStart: cs, ServerTLS: serverTLS, Registry: reg, Logger: logger,
		Leader: leaderOpts, Unleased: f.unleased,
		PerConnection: f.perConnection, PerIdentity: f.perIdentity,
		Envoy: envoy,
		Extra: []func(*grpc.Server){
			func(g *grpc.Server) { reflection.Register(g) },
		},
	})
	if err != nil {
		return err
	}
	// The Envoy endpoint decides from leases this process holds itself: a
	// lease client of its own LeaseService, reached in memory so that it
	// keeps deciding while the gRPC listener drains.
	target, dial := d.Loopback()
	loop, err := envoyrls.DialLoopback(target, nil, lease.Options{
		// Unique per process incarnation: replicas run with the same
		// listen address, and a restarted process must not take over its
		// former life's leases.
		InstanceID: lease.UniqueID("envoy"),
		Logger:     logger, Registerer: reg,
		// Degraded decisions count under the key's tier, as the Envoy
		// endpoint's own decisions do; a config applied during an outage
		// decides the degraded requests at once; a key the region never
		// answered runs its local policy within the region's static share.
		Tier:        envoyrls.LiveTier(source),
		Policies:    envoyrls.LivePolicies(source),
		StaticShare: envoyrls.LiveStaticShare(source, f.region),
	}, dial...)
	if err != nil {
		d.Stop()
		return err
	}
	envoy.SetLimiter(loop)
	if started != nil {
		started(d.GRPCAddr())
	}

	<-ctx.Done()
	// Health NOT_SERVING first, then the in-flight calls finish (the Envoy
	// ones still deciding from the lease client), then the client releases
	// its leases, then the rest (docs/operations.md, Shutdown).
	logger.Info("shutting down: health NOT_SERVING, draining in-flight calls, then releasing leased tokens")
	d.Drain()
	cctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	if err := loop.Close(cctx); err != nil {
		logger.Warn("releasing the Envoy endpoint's leased tokens failed; they return to the region when their leases expire", "err", err)
	}
	cancel()
	d.Stop()
	return nil
}

// releaseTimeout bounds the release of the Envoy endpoint's leased tokens
// at shutdown.
const releaseTimeout = 5 * time.Second

// redisTLSConfig is the TLS configuration towards Redis the -redis-tls*
// flags ask for: nil (plaintext) when none is set.
func redisTLSConfig(f *flags, opts ...tlsconfig.Option) (*tls.Config, error) {
	cfg, err := tlsconfig.Client(f.redisTLSCA, f.redisTLSCert, f.redisTLSKey, f.redisTLSName, opts...)
	if err != nil {
		return nil, fmt.Errorf("redis TLS (-redis-tls-ca, -redis-tls-cert, -redis-tls-key): %w", err)
	}
	if cfg == nil && f.redisTLS {
		cfg = &tls.Config{MinVersion: tlsconfig.MinVersion}
	}
	return cfg, nil
}

func loadConfig(file string) (*config.Config, error) {
	if file == "" {
		return config.Default(), nil
	}
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
