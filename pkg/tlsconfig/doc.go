// Package tlsconfig builds crypto/tls configurations from PEM files for
// Sluice's daemons and their clients (gRPC servers, region-to-global
// calls, etcd).
//
// Invariant: every configuration it returns requires TLS 1.2 or newer, and
// a server configuration given a client CA requires and verifies a client
// certificate signed by it (mutual TLS). When no file is given at all the
// result is nil, meaning "no TLS"; a partial set of files (a certificate
// without its key) is an error, never a silent downgrade. Errors name the
// file concerned.
//
// Files are read once, when the configuration is built: rotating
// certificates takes a restart.
package tlsconfig
