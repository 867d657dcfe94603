// Package config is Sluice's operator configuration: its schema, defaults,
// validation, YAML form, and its home in etcd (one key, hot-reloaded).
//
// Invariant: a *Config handed out by Parse, Default, Store.Get or
// Watcher.Current has passed Validate, and a config that fails Validate is
// never written by Store.Apply nor made live by a Watcher. Validation
// reports every problem at once, each naming its field path
// (tiers.free.write.rate) and wrapping ErrInvalidConfig.
//
// Units: rates are tokens per second (float64; written "10/s", "6/m",
// "1000/h" or a bare number meaning per second); bursts are whole tokens;
// durations are time.Duration (written "1s", "250ms"); region shares are
// fractions of a key's global rate in [0, 1].
//
// A *Config is a plain value: it is safe for concurrent reads, and values
// shared by a Watcher must never be modified.
package config
