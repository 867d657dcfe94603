// Package stopsignal names the signals Sluice's commands stop gracefully
// on, so that every daemon drains, hands over and releases what it holds
// on the same ones (docs/operations.md, "Signals").
//
// SIGHUP is among them: a daemon started from a shell or a supervisor
// that closes its terminal gets it, and its default action ends the
// process at once, without the drain: an agent then kept its leased
// tokens until their TTL, a region leader its leadership until its session
// lapsed. No command reloads anything on SIGHUP (the config comes from
// etcd, watched), so a hangup is a stop like the others.
package stopsignal

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Signals are the signals a command stops gracefully on: SIGINT, SIGTERM
// and SIGHUP.
var Signals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

// NotifyContext is signal.NotifyContext(parent, Signals...): ctx ends at
// the first of Signals; stop restores their default actions, so a second
// signal after stop ends the process at once.
func NotifyContext(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(parent, Signals...)
}
