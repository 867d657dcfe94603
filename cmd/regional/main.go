// Command regional is Sluice's regional service: it keeps the region's
// share of every quota as token buckets in the region's Redis and leases
// batches of tokens to application instances over gRPC.
//
// Every flag can also be set from the environment: -redis-addr from
// SLUICE_REDIS_ADDR, and so on (the command line wins).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/flagenv"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/regional"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "regional:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("regional", flag.ContinueOnError)
	region := fs.String("region", "us-east", "region this service serves (must be in the config)")
	grpcAddr := fs.String("listen", "127.0.0.1:7400", "gRPC listen address (LeaseService, health)")
	httpAddr := fs.String("metrics-listen", "127.0.0.1:7401", `HTTP listen address for /metrics and /healthz ("off" disables)`)
	redisAddr := fs.String("redis-addr", "127.0.0.1:6379", "the region's Redis (host:port)")
	redisPassword := fs.String("redis-password", "", "Redis password")
	configFile := fs.String("config", "", "config file (YAML); empty = the built-in sample config")
	coldStart := fs.String("cold-start", "conservative", `how an empty Redis is treated at start: "conservative" (new buckets start empty for one lease TTL) or "full"`)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	flagenv.Usage(fs, "SLUICE")
	if err := flagenv.Parse(fs, "SLUICE", args, os.Getenv); err != nil {
		return err
	}
	logger, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	cfg := config.Default()
	if *configFile != "" {
		data, err := os.ReadFile(*configFile)
		if err != nil {
			return err
		}
		if cfg, err = config.Parse(data); err != nil {
			return fmt.Errorf("config %s: %w", *configFile, err)
		}
	}
	cs, err := regional.ParseColdStart(*coldStart)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := regional.StartDaemon(ctx, regional.DaemonOptions{
		Region: *region, GRPCAddr: *grpcAddr, HTTPAddr: *httpAddr,
		RedisAddr: *redisAddr, RedisPassword: *redisPassword,
		Config: regional.StaticConfig{C: cfg}, ColdStart: cs, Logger: logger,
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	logger.Info("shutting down: draining")
	d.Stop()
	return nil
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, errors.New("log level " + level + ": want debug, info, warn or error")
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
