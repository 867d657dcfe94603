package envoyrls_test

import (
	"context"
	"log"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
)

// The regional daemon serves the Envoy endpoint on its own gRPC server,
// behind its authorization and bounds, answering in wire form
// (RegisterEncoded). The Service is given to the daemon at its start; the
// lease client that decides for it can only dial the daemon's address
// after the start.
func ExampleRegisterEncoded() {
	cfg := regional.StaticConfig{C: config.Default()}
	svc, err := envoyrls.New(envoyrls.Options{Config: cfg})
	if err != nil {
		log.Fatal(err)
	}
	d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
		Region: "us-east", RedisAddr: "127.0.0.1:6379", Config: cfg,
		Unleased: true, // a single region with no global tier
		Envoy:    svc,
	})
	if err != nil {
		log.Fatal(err)
	}
	// The daemon's own registry exports the sluice_envoy_* metrics.
	d.Registry.MustRegister(svc)
	lim, err := envoyrls.DialLoopback(d.GRPCAddr(), nil, lease.Options{
		InstanceID: "envoy-rls-us-east-1", Registerer: d.Registry,
	})
	if err != nil {
		log.Fatal(err)
	}
	svc.SetLimiter(lim)

	// ... serve until shutdown, then return the leased tokens first:
	lim.Close(context.Background())
	d.Stop()
}
