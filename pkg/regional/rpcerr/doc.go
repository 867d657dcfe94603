// Package rpcerr is what a regional service's error answers say beyond
// their gRPC code: an ErrorInfo (google.rpc.ErrorInfo, domain
// ErrorDomain) naming the cause, so that a caller can tell a service it
// reached whose Redis failed from one it could not reach (both
// Unavailable). It depends on gRPC's status types only, so the lease
// client, sluicectl and the service share it (docs/architecture.md,
// "Errors map to gRPC codes at the edges").
//
// Its functions keep no state and are safe for concurrent use.
package rpcerr
