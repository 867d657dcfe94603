package grpctest_test

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/sluicehq/sluice/internal/grpctest"
)

// A refused address refuses a dial at once, and keeps its port from
// every listener until the test ends: a port picked and freed was once
// handed to a parallel test's etcd, which answered.
func TestRefusedAddrRefusesAndKeepsItsPort(t *testing.T) {
	addr := grpctest.RefusedAddr(t)
	_, err := net.Dial("tcp", addr)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v, want connection refused", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		ln.Close()
		t.Fatalf("listen on %s succeeded while the refused address holds it", addr)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("listen on %s: %v, want address in use", addr, err)
	}
}

// Once the test that held it ends, the port is free again.
func TestRefusedAddrFreesItsPort(t *testing.T) {
	var addr string
	t.Run("hold", func(t *testing.T) { addr = grpctest.RefusedAddr(t) })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s after its test ended: %v", addr, err)
	}
	ln.Close()
}
