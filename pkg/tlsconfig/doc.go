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
// Certificates rotate without a restart: a handshake takes the current
// contents of the certificate, key and (server side) client CA files,
// looked at again at most every ReloadInterval, so files replaced in place
// (a renewed Kubernetes Secret) serve new connections within that time.
// Files that change but do not load (a certificate beside the old key)
// are logged and the last good ones kept. The CA a client verifies its
// server with (caFile of Client) is read once: changing it takes a
// restart, so a new CA is added to the bundle before it signs anything.
package tlsconfig
