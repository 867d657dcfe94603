package grpctest

import (
	"net"
	"testing"

	"google.golang.org/grpc"
)

// Serve serves srv on a free loopback port until tb ends and returns the
// address (host:port).
func Serve(tb testing.TB, srv *grpc.Server) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Serve(ln)
	tb.Cleanup(srv.Stop)
	return ln.Addr().String()
}
