// Package embedetcd starts a single-member etcd inside the process on
// loopback ports chosen by the kernel: for tests, development mode and the
// simulator's live mode. Production runs an external etcd cluster.
package embedetcd

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// StartTimeout bounds how long Start waits for the member to be ready.
const StartTimeout = 30 * time.Second

// Start runs etcd with its data in dir. Only errors are logged, to log
// (nil: discarded). The client address is e.Clients[0].Addr().
func Start(name, dir string, log *zap.Logger) (*embed.Etcd, error) {
	return StartAt(name, dir, "127.0.0.1:0", "127.0.0.1:0", log)
}

// StartAt is Start with the client and peer listeners on the given
// host:port addresses (port 0: chosen by the kernel). Started again on the
// same dir and addresses after Close, it is the same member with the same
// data, at the endpoint its clients already dial.
func StartAt(name, dir, clientAddr, peerAddr string, log *zap.Logger) (*embed.Etcd, error) {
	if log == nil {
		log = zap.NewNop()
	}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	// etcd reports its own orderly shutdown at error level: noise unless
	// something failed.
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(log)
	client := url.URL{Scheme: "http", Host: clientAddr}
	peer := url.URL{Scheme: "http", Host: peerAddr}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// One member never needs heartbeats; short ticks only make the first
	// election quick.
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	// The gateway would dial the configured client address, which is
	// port 0; Sluice speaks gRPC only.
	cfg.EnableGRPCGateway = false
	// Callers close etcd gracefully and its data is disposable.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	timer := time.NewTimer(StartTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd failed while starting: %w", err)
	case <-timer.C:
		e.Close()
		return nil, fmt.Errorf("embedded etcd not ready after %v", StartTimeout)
	}
	if len(e.Clients) == 0 {
		e.Close()
		return nil, fmt.Errorf("embedded etcd has no client listener")
	}
	return e, nil
}
