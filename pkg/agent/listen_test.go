package agent_test

import (
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
)

// TestExplicitAddressesAreKept: the agent listens on exactly the
// addresses it was given.
func TestExplicitAddressesAreKept(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	free := func() string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		return lis.Addr().String()
	}
	grpcAddr, httpAddr, metricsAddr := free(), free(), free()
	a, err := agent.Start(agent.Options{
		RegionAddr: "127.0.0.1:1", Config: agent.StaticConfig{C: cfg},
		GRPCAddr: grpcAddr, HTTPAddr: httpAddr, MetricsAddr: metricsAddr,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	if a.GRPCAddr() != grpcAddr || a.HTTPAddr() != httpAddr || a.MetricsAddr() != metricsAddr {
		t.Errorf("listening on grpc %s, http %s, metrics %s; want %s, %s, %s",
			a.GRPCAddr(), a.HTTPAddr(), a.MetricsAddr(), grpcAddr, httpAddr, metricsAddr)
	}
}

// TestEmptyAddressesMeanTheDefaults: a listen address left empty is the
// package's default. Each default is held here first, so Start must fail
// on it, naming it, while the other listeners are given free ports.
func TestEmptyAddressesMeanTheDefaults(t *testing.T) {
	cfg := regiontest.MustConfig(t, conformanceConfig)
	for _, c := range []struct {
		name string
		addr string
		edit func(*agent.Options)
	}{
		{"grpc", agent.DefaultGRPCAddr, func(o *agent.Options) { o.GRPCAddr = "" }},
		{"http", agent.DefaultHTTPAddr, func(o *agent.Options) { o.HTTPAddr = "" }},
		{"metrics", agent.DefaultMetricsAddr, func(o *agent.Options) { o.MetricsAddr = "" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			// If another process holds the default already, it is taken
			// all the same.
			if lis, err := net.Listen("tcp", c.addr); err == nil {
				defer lis.Close()
			}
			o := agent.Options{
				RegionAddr: "127.0.0.1:1", Config: agent.StaticConfig{C: cfg},
				GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
				Logger: slog.New(slog.DiscardHandler),
			}
			c.edit(&o)
			a, err := agent.Start(o)
			if err == nil {
				a.Stop()
				t.Fatalf("Start with the %s address empty and %s taken: no error", c.name, c.addr)
			}
			if !strings.Contains(err.Error(), c.addr) {
				t.Errorf("Start with the %s address empty and %s taken: %v; want an error naming %s", c.name, c.addr, err, c.addr)
			}
		})
	}
}
