// Package envoy holds envoy.yaml, an Envoy bootstrap that puts Envoy in
// front of a service and limits it with Sluice's Envoy rate-limit service,
// and the test that parses it as Envoy's Bootstrap, validates it, and
// checks that the descriptors its route actions produce resolve to
// configured quota keys of the built-in sample config.
package envoy
