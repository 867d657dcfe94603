package memlisten

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// ErrClosed is what Accept and Dial return once the listener is closed. It
// matches net.ErrClosed, which gRPC and net/http servers take as the end of
// their Serve loop.
var ErrClosed = fmt.Errorf("memlisten: %w", net.ErrClosed)

// Addr is the listener's address. (Its connections' ends report net.Pipe's.)
type Addr struct{}

// Network is "memory".
func (Addr) Network() string { return "memory" }

// String is "memory".
func (Addr) String() string { return "memory" }

// Listener is an in-memory net.Listener. Safe for concurrent use; the zero
// value is not usable, use New.
type Listener struct {
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

// New returns an open listener.
func New() *Listener {
	return &Listener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept waits for a Dial and returns the server end of its connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case <-l.done:
		return nil, ErrClosed
	default:
	}
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, ErrClosed
	}
}

// Close stops the listener: pending and later Accept and Dial calls
// return ErrClosed. Connections already handed over stay open.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

// Addr is Addr{}.
func (l *Listener) Addr() net.Addr { return Addr{} }

// Dial connects to the listener: it returns the client end of a
// connection once an Accept has taken the server end, ctx.Err() when ctx
// ends first, ErrClosed when the listener is closed.
func (l *Listener) Dial(ctx context.Context) (net.Conn, error) {
	select {
	case <-l.done:
		return nil, ErrClosed
	default:
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		client.Close()
		server.Close()
		return nil, ErrClosed
	case <-ctx.Done():
		client.Close()
		server.Close()
		return nil, ctx.Err()
	}
}
