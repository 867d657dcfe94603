package envoyrls

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
)

// LivePolicies is lease.Options.Policies from the live config of src: a
// class's on_failure policy and shadow mode as the config the process
// holds now names them, so a config applied while the region is out of
// reach (an operator switching a class to closed for an outage) decides
// the next degraded request, before any answer of the region could carry
// it. False without a config or for a class it does not name.
func LivePolicies(src ConfigSource) func(class string) (lease.ClassPolicy, bool) {
	return func(class string) (lease.ClassPolicy, bool) {
		cfg := src.Current()
		if cfg == nil {
			return lease.ClassPolicy{}, false
		}
		cl, ok := cfg.Classes[class]
		if !ok {
			return lease.ClassPolicy{}, false
		}
		m, err := lease.ParseMode(string(cl.Mode))
		if err != nil {
			return lease.ClassPolicy{}, false
		}
		p, err := lease.ParsePolicy(string(cl.OnFailure))
		if err != nil {
			return lease.ClassPolicy{}, false
		}
		return lease.ClassPolicy{Mode: m, OnFailure: p, Shadow: cl.Shadow}, true
	}
}

// LiveStaticShare is lease.Options.StaticShare from the live config of
// src: the static share of a key's limit the config gives region
// (config.Config.StaticShareOf: rate·w_r/Σw, the burst's share in whole
// units; a drained region's floor), so that a key the region never
// answered for this process runs its local on_failure policy at no more
// than that per instance while the region is out of reach, rather than at
// lease.Options.FallbackLimit whatever its limit. Whether the region's
// static lease lapsed (its partition floor then) is not knowable without
// the region, so the share is the static one. A region the config does
// not name (or "": a process that does not know its region) takes the
// largest share of any region the config names, rate and burst each, a
// bound on its own. False without a config or for a key it does not
// resolve.
func LiveStaticShare(src ConfigSource, region string) func(quota.Key) (quota.Limit, bool) {
	return func(k quota.Key) (quota.Limit, bool) {
		cfg := src.Current()
		if cfg == nil {
			return quota.Limit{}, false
		}
		res, err := cfg.Resolve(k)
		if err != nil {
			return quota.Limit{}, false
		}
		if _, ok := cfg.Regions[region]; ok {
			rate, burst, err := cfg.StaticShareOf(region, res)
			if err != nil {
				return quota.Limit{}, false
			}
			return quota.Limit{Rate: rate, Burst: int64(burst)}, true
		}
		var lim quota.Limit
		found := false
		for name := range cfg.Regions {
			rate, burst, err := cfg.StaticShareOf(name, res)
			if err != nil {
				continue
			}
			lim.Rate, lim.Burst, found = max(lim.Rate, rate), max(lim.Burst, int64(burst)), true
		}
		return lim, found
	}
}

// LiveTier names a key's tier as the config the process holds now resolves
// it, as the region does ("" without a config or for a key it does not
// resolve): a lease client counts its decisions made before the region
// answered for the key (the on_failure policy's while the region is out of
// reach) under it, as sluice_envoy_decisions_total does.
func LiveTier(src ConfigSource) func(quota.Key) string {
	return func(k quota.Key) string {
		cfg := src.Current()
		if cfg == nil {
			return ""
		}
		res, err := cfg.Resolve(k)
		if err != nil {
			return ""
		}
		return res.Tier
	}
}

// Loopback is a Limiter: a lease client with its own gRPC connection to a
// LeaseService, normally the regional daemon's own listener, so the
// process that serves Envoy is one more instance of its region. Safe for
// concurrent use.
type Loopback struct {
	conn   *grpc.ClientConn
	client *lease.Client
}

// DialLoopback connects a lease client to the LeaseService at addr (for a
// regional daemon: the target of Daemon.Loopback with its dial options,
// which reach the daemon in memory and keep serving while it drains; or
// Daemon.GRPCAddr(), after StartDaemon returned). creds must match the
// server's (nil means plaintext, for a daemon without ServerTLS or its
// in-memory LeaseService). dial are more dial options. opts are the lease
// client's; give it an InstanceID unique to this process
// (lease.UniqueID), the daemon's Registerer to see its sluice_client_*
// metrics, and Tier, Policies and StaticShare (LiveTier, LivePolicies and
// LiveStaticShare of the daemon's config and region) so that the degraded
// decisions of keys the region has not answered count under their tier
// and run their local policy within the region's static share, and a
// config applied during an outage decides its degraded requests at once. Set opts.BreakerTimeout
// (default 50ms) below the timeout of Envoy's filter (default 20ms) so
// that, while the region is slow, Envoy gets the class's on_failure
// decision instead of timing out.
//
// Close it once the calls it decides for have finished (after
// Daemon.Drain) and before stopping the daemon, so its unspent tokens go
// back to the region instead of waiting out the lease TTL.
func DialLoopback(addr string, creds credentials.TransportCredentials, opts lease.Options, dial ...grpc.DialOption) (*Loopback, error) {
	if addr == "" {
		return nil, fmt.Errorf("%w: envoyrls: loopback address is empty", quota.ErrInvalid)
	}
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	// Reconnects back off at most lease.MaxReconnectDelay (gRPC's default
	// grows to 120 s, long after the region is back).
	// No keepalive (lease.KeepaliveParams): the loopback is in memory, to
	// a server of the same process that pings could only make close it
	// (its server permits none).
	dial = append([]grpc.DialOption{grpc.WithTransportCredentials(creds), grpc.WithConnectParams(lease.ConnectParams())}, dial...)
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("envoyrls: dialling the LeaseService at %s: %w", addr, err)
	}
	client, err := lease.NewClient(conn, opts)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("envoyrls: loopback lease client: %w", err)
	}
	// Connect now rather than on the first request: the first Envoy call
	// on a key would otherwise wait for the connection too, and the
	// region's bucket, full at its cap, refills nothing meanwhile.
	conn.Connect()
	return &Loopback{conn: conn, client: client}, nil
}

// Allow implements Limiter.
func (l *Loopback) Allow(ctx context.Context, key quota.Key, cost int64) (quota.Decision, error) {
	return l.client.Allow(ctx, key, cost)
}

// Client is the underlying lease client (for its Table and metrics).
func (l *Loopback) Client() *lease.Client { return l.client }

// Cap is lease.Client.Cap.
func (l *Loopback) Cap(key quota.Key) (int64, bool) { return l.client.Cap(key) }

// Close releases every token the client holds (bounded by ctx), then
// closes the connection. Allow fails with lease.ErrClosed afterwards.
func (l *Loopback) Close(ctx context.Context) error {
	err := l.client.Close(ctx)
	if cerr := l.conn.Close(); cerr != nil {
		err = errors.Join(err, fmt.Errorf("envoyrls: closing the loopback connection: %w", cerr))
	}
	return err
}
