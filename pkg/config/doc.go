// Package config is Sluice's operator configuration: its schema, defaults,
// validation and YAML form. It is pure: it links neither etcd nor gRPC, so
// the simulator, the scenario reader and sluicectl's offline commands use it
// without a cluster. The config's home in etcd (one key, hot-reloaded) is
// package configstore.
//
// Invariant: a *Config handed out by Parse or Default has passed Validate.
// Validation reports every problem at once, each naming its field path
// (tiers.free.write.rate) and wrapping ErrInvalidConfig.
//
// Units: rates are tokens per second (float64; written "10/s", "6/m",
// "1000/h", "5/d" or a bare number meaning per second); bursts are whole tokens;
// durations are time.Duration (written "1s", "250ms"); region shares are
// fractions of a key's global rate in [0, 1].
//
// A *Config is a plain value: it is safe for concurrent reads, and values
// shared between goroutines (as configstore.Watcher shares them) must never
// be modified.
package config

// The configuration reference, docs/config.md, is generated from the doc
// comments of the schema's fields (see internal/configdoc).
//go:generate go run ./internal/configdoc -dir . -o ../../docs/config.md
