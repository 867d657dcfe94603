// Package regions holds Sluice's Kubernetes manifests: a kustomize base
// (base/) with two optional components (base/global, base/tls) and one
// overlay per region (us-east, eu-west, ap-south). It has no Go API; its
// tests render every overlay with `kubectl kustomize` and check what the
// daemons need to run correctly.
//
// Invariants the tests hold the manifests to:
//   - every overlay directory is a region: its name is the -region of its
//     regional Deployment, its namespace is sluice-<region>, and the region
//     is in the bootstrap config;
//   - every region carries the same bootstrap config byte for byte (one
//     global config; only addresses differ), it passes config.Parse, and its
//     regions are exactly the overlays;
//   - the global allocator runs in exactly one overlay, with 3 replicas, and
//     every region's -global-addr names its Service;
//   - all regions share one etcd cluster and prefix, and each has its own
//     Redis;
//   - every pod is probed, budgeted, spread, non-root with a read-only root
//     filesystem and no capabilities, and its image is pinned.
//
// Units: ports are TCP port numbers, replica counts are pods, CPU and memory
// are Kubernetes resource quantities, probe timings are seconds.
package regions
