// Package e2e holds Sluice's whole-system tests: several regions, each
// with its own real redis-server, the global allocator's leader and
// standby elected through a real (embedded) etcd, and application
// instances using the real lease client — all on loopback gRPC in one
// process (internal/devcluster).
package e2e
