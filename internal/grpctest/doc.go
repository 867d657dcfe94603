// Package grpctest serves a gRPC server on a loopback port for the length
// of one test.
//
// Invariant: the server listens only on 127.0.0.1, on a port the kernel
// picks, and is stopped (its connections closed) when the test ends.
package grpctest
