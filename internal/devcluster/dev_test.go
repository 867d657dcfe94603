package devcluster

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/config"
)

// TestRunDevRefusesARegionNotInTheConfig: bad input is a clear error that
// names the regions there are, and nothing starts or is printed.
func TestRunDevRefusesARegionNotInTheConfig(t *testing.T) {
	var out bytes.Buffer
	err := RunDev(context.Background(), DevOptions{Config: config.Default(), Region: "atlantis", Out: &out})
	if err == nil || !strings.Contains(err.Error(), `"atlantis" is not in the config`) || !strings.Contains(err.Error(), "us-east") {
		t.Fatalf("err = %v", err)
	}
	if out.Len() != 0 {
		t.Fatalf("printed %q", out.String())
	}
}

// TestRunDevRefusesABusyListenAddress: a -listen address in use is a clear
// error naming it, and what had started is stopped (no panic on the way
// out of a failed Start).
func TestRunDevRefusesABusyListenAddress(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var out bytes.Buffer
	err = RunDev(context.Background(), DevOptions{Config: config.Default(), Region: "us-east",
		Listen: ListenAddrs{GRPC: l.Addr().String()}, Out: &out})
	if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Fatalf("err = %v", err)
	}
	if out.Len() != 0 {
		t.Fatalf("printed %q", out.String())
	}
}
