// Package configstore keeps Sluice's config (package config) in etcd: a
// Store reads and writes it as the YAML document without its tenants in
// <prefix>/config and one key per tenant under <prefix>/config/tenants/
// (see Store), and a Watcher hot-reloads it into a running daemon,
// checking a change of some tenants against the document alone. It is the
// only config code that links etcd; the schema and validation stay in
// package config, which the simulator and offline tools use alone.
//
// Invariant: a *config.Config handed out by Store.Get, Store.At,
// Watcher.Current or Watcher.History has passed config.Validate; a config that fails it is never written by
// Store.Apply nor made live by a Watcher, which keeps the last good config
// through invalid writes and etcd outages. Store.Apply writes only if the
// document key is still at the revision the change was computed from,
// else it fails with ErrConflict and writes nothing. A Watcher makes a
// change live only at a revision that wrote the document and while no
// batched apply is in progress, so the tenants of a batched apply become
// live together, at its commit, in every daemon. Tenant keys written
// after the document outside a batched apply (by hand, past the Store)
// are never made live: Get and a Watcher refuse the stored config, and
// AwaitEtcdConfig starts on the newest valid config in etcd's history.
//
// Units: revisions are etcd mod revisions of the document key (0: it is absent, or the
// Watcher is on its fallback); the Watcher's retry pauses are
// time.Duration, growing from 50ms to 5s after each failed read.
//
// Concurrency: Store is safe for concurrent use. A Watcher's Current,
// Revision, Subscribe and Updates are safe for concurrent use and never
// block on etcd; one goroutine runs Run. Watcher.History reads etcd,
// bounded as one read at start is. Configs it hands out are shared
// and must never be modified.
package configstore
