// Package agentdeploy holds an example of the Sluice agent (cmd/agent) as
// a native sidecar of an application's Deployment, in region us-east. It
// has no Go API; its test renders it with `kubectl kustomize` and checks it
// against the agent binary's flags and the regional manifests: every flag
// set in args or through a SLUICE_* variable exists, the APIs listen on
// loopback only, the region address names the region's headless Service,
// the etcd endpoints and prefix are the region's, the sidecar is probed,
// non-root with a read-only root filesystem and no capabilities, and its
// image is pinned.
package agentdeploy
