// Command global is Sluice's global allocator: replicas elect one leader in
// etcd, which divides every contended key's global rate among the regions
// each epoch and hands out grants; the others stand by and redirect.
//
// The live config is the one in etcd (<prefix>/config), hot-reloaded.
// -config writes a bootstrap config there only when etcd holds none. A
// replica starts serving only once etcd has answered and it runs on the
// config etcd holds, so it never leads on a stale or built-in fallback.
// SIGINT or SIGTERM makes it stop granting, resign (a standby takes over
// at once) and drain.
//
// Every flag can also be set from the environment: -etcd-endpoints from
// SLUICE_ETCD_ENDPOINTS, and so on (the command line wins).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/etcdflags"
	"github.com/sluicehq/sluice/internal/flagenv"
	"github.com/sluicehq/sluice/internal/stopsignal"
	"github.com/sluicehq/sluice/internal/version"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/rpcguard"
	"github.com/sluicehq/sluice/pkg/shard"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h: the usage went to stderr
		}
		fmt.Fprintln(os.Stderr, "global:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error { return runNotifying(ctx, args, nil) }

// runNotifying is run that, once the daemon serves, calls started with its
// bound gRPC address (tests listen on :0 and learn the port this way,
// instead of racing other processes for a port they picked).
func runNotifying(ctx context.Context, args []string, started func(grpcAddr string)) error {
	fs := flag.NewFlagSet("global", flag.ContinueOnError)
	grpcAddr := fs.String("listen", allocator.DefaultGRPCAddr, "gRPC listen address (AllocatorService, health)")
	httpAddr := fs.String("metrics-listen", allocator.DefaultHTTPAddr, `HTTP listen address for /metrics and /healthz ("off" disables)`)
	advertise := fs.String("advertise", "", "host:port regions and other replicas reach this replica at (default: the bound -listen address)")
	endpoints := fs.String("etcd-endpoints", "", "etcd endpoints, comma separated host:port (required)")
	prefix := fs.String("etcd-prefix", config.DefaultPrefix, "etcd key prefix for the config and the election")
	configFile := fs.String("config", "", "bootstrap config (YAML) written to etcd only when etcd holds no config; empty = the built-in sample as fallback")
	shardFlag := fs.String("shard", "0", `the global-tier shard this replica serves (0..global_shards-1, pkg/shard), or "ordinal": the number ending the host name, as a StatefulSet pod's (sluice-global-2 serves shard 2)`)
	sessionTTL := fs.Duration("session-ttl", allocator.DefaultSessionTTL, "etcd session TTL behind the leadership (whole seconds); a leader stops granting half of it after losing etcd")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	tlsCert := fs.String("tls-cert", "", "server certificate (PEM) for gRPC; enables TLS")
	tlsKey := fs.String("tls-key", "", "server private key (PEM)")
	tlsClientCA := fs.String("tls-client-ca", "", "CA bundle (PEM) client certificates must chain to; enables mutual TLS")
	var etcdAccess etcdflags.Access
	etcdAccess.Register(fs)
	perConnection := fs.Int("max-inflight-per-connection", rpcguard.DefaultPerConnection, "units of work (keys named by the calls) served at once per client connection, at least the keys of one report; more wait their turn (docs/operations.md, Request bounds)")
	perIdentity := fs.Int("max-inflight-per-identity", rpcguard.DefaultPerIdentity, "units of work served at once per client certificate identity (mutual TLS only)")
	maxReportBytes := fs.Int("max-report-bytes", allocator.DefaultMaxReportBytes, "bytes the leader holds of a region's paged report until its last page arrives (its pages' wire bytes and 384 per key); a larger report is refused (docs/operations.md, Request bounds)")
	showVersion := fs.Bool(flagenv.VersionFlag, false, "print the version and exit")
	flagenv.Usage(fs, "SLUICE")
	if err := flagenv.Parse(fs, "SLUICE", args, os.Getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		// Parsing stops at the first argument that is no flag: the flags
		// after it would otherwise be dropped unread.
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *showVersion {
		fmt.Println(version.String("global"))
		return nil
	}
	if err := checkFlags(*sessionTTL, *perConnection, *perIdentity, *maxReportBytes); err != nil {
		return err
	}
	if err := checkAdvertise(*advertise); err != nil {
		return err
	}
	logger, err := flagenv.Logger(*logLevel)
	if err != nil {
		return err
	}
	shardIndex, err := parseShard(*shardFlag, os.Hostname)
	if err != nil {
		return err
	}
	eps := flagenv.List(*endpoints)
	if len(eps) == 0 {
		return errors.New("-etcd-endpoints is required (comma separated host:port list)")
	}
	serverTLS, err := tlsconfig.Server(*tlsCert, *tlsKey, *tlsClientCA, tlsconfig.WithLogger(logger))
	if err != nil {
		return err
	}
	fallback := config.Default()
	var bootstrap *config.Config
	if *configFile != "" {
		data, err := os.ReadFile(*configFile)
		if err != nil {
			return err
		}
		if bootstrap, err = config.Parse(data); err != nil {
			return fmt.Errorf("config %s: %w", *configFile, err)
		}
		fallback = bootstrap
	}

	cli, err := etcdAccess.Client(eps)
	if err != nil {
		return err
	}
	defer cli.Close()

	ctx, stop := stopsignal.NotifyContext(ctx)
	defer stop()
	store := configstore.NewStore(cli, *prefix)
	reg := prometheus.NewRegistry()
	watcher := configstore.NewWatcher(store, fallback, logger, reg)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan error, 1)
	go func() { watchDone <- watcher.Run(watchCtx) }()
	defer func() {
		stopWatch()
		if err := <-watchDone; err != nil {
			logger.Error("config watcher", "error", err)
		}
	}()

	if _, err := configstore.AwaitEtcdConfig(ctx, store, bootstrap, watcher, logger); err != nil {
		if ctx.Err() != nil {
			// A stop requested while waiting for etcd is a clean stop.
			logger.Info("stopped before start: etcd's config was still awaited")
			return nil
		}
		return err
	}
	d, err := allocator.StartDaemon(ctx, allocator.DaemonOptions{
		GRPCAddr: *grpcAddr, HTTPAddr: *httpAddr, Advertise: *advertise,
		Etcd: cli, Prefix: *prefix, Shard: shardIndex, SessionTTL: *sessionTTL, Config: watcher,
		ServerTLS: serverTLS, Registry: reg, Logger: logger,
		PerConnection: *perConnection, PerIdentity: *perIdentity, MaxReportBytes: *maxReportBytes,
	})
	if err != nil {
		return err
	}
	if started != nil {
		started(d.GRPCAddr())
	}
	<-ctx.Done()
	logger.Info("shutting down: resigning and draining")
	d.Stop()
	return nil
}

// parseShard is the -shard flag's shard: a number, or "ordinal" for the
// number ending the host name (a StatefulSet pod's ordinal).
func parseShard(v string, hostname func() (string, error)) (int, error) {
	if v == "ordinal" {
		host, err := hostname()
		if err != nil {
			return 0, fmt.Errorf("-shard ordinal: %w", err)
		}
		i := strings.LastIndexByte(host, '-')
		n, err := strconv.Atoi(host[i+1:])
		if i < 0 || err != nil || n < 0 || n >= shard.MaxShards {
			return 0, fmt.Errorf("-shard ordinal: host name %q does not end in -N with N in 0..%d (a StatefulSet pod's name does)", host, shard.MaxShards-1)
		}
		return n, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n >= shard.MaxShards {
		return 0, fmt.Errorf("-shard %q: want a shard in 0..%d or \"ordinal\"", v, shard.MaxShards-1)
	}
	return n, nil
}

// checkAdvertise refuses an -advertise that is not host:port. The address
// is what etcd names as the leader: standbys send regions to it and
// sluicectl status asks it, so a mistake (a port left out) left every
// region unable to reach a leader it could not dial, its grants lapsing,
// while the replica ran and led as if nothing were wrong. Empty is the
// bound -listen address.
func checkAdvertise(addr string) error {
	if addr == "" {
		return nil
	}
	if err := flagenv.HostPort(addr); err != nil {
		return fmt.Errorf("-advertise %q: want the host:port regions and other replicas dial this replica at: %v", addr, err)
	}
	return nil
}

// checkFlags refuses the values the allocator would refuse in the words of
// its options (or raise without a word), naming the flag.
func checkFlags(sessionTTL time.Duration, perConnection, perIdentity, maxReportBytes int) error {
	switch {
	case sessionTTL < time.Second || sessionTTL%time.Second != 0:
		return fmt.Errorf("-session-ttl %v must be whole seconds, at least 1s", sessionTTL)
	case perConnection < 1:
		return fmt.Errorf("-max-inflight-per-connection %d must be at least 1", perConnection)
	case perIdentity < 1:
		return fmt.Errorf("-max-inflight-per-identity %d must be at least 1", perIdentity)
	case maxReportBytes < 0:
		return fmt.Errorf("-max-report-bytes %d must not be negative", maxReportBytes)
	}
	return nil
}
