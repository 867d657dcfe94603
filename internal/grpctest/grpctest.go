package grpctest

import (
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"google.golang.org/grpc"
)

// Serve serves srv on a free loopback port until tb ends and returns the
// address (host:port).
func Serve(tb testing.TB, srv *grpc.Server) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go srv.Serve(ln)
	tb.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// RefusedAddr is a loopback address nothing listens on: a dial to it is
// refused at once, as a region that is down. The port stays bound (a
// socket bound without listening, which the kernel answers with a reset)
// until tb ends, so no other test's listener can be given it meanwhile:
// a port picked and freed could be handed to a server started by a
// parallel test, which would then answer.
func RefusedAddr(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		tb.Fatalf("refused address: socket: %v", err)
	}
	tb.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatalf("refused address: bind: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatalf("refused address: getsockname: %v", err)
	}
	in4, ok := sa.(*syscall.SockaddrInet4)
	if !ok {
		tb.Fatalf("refused address: bound to %T", sa)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(in4.Port))
}

// SilentAddr is a loopback address that accepts connections and never
// answers on them, as a hung process; onAccept (optional) is called on
// the first connection. It stops when tb ends.
func SilentAddr(tb testing.TB, onAccept func()) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn // guarded by mu
		wg    sync.WaitGroup
		once  sync.Once
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if onAccept != nil {
				once.Do(onAccept)
			}
		}
	})
	tb.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// Closing is a loopback address that accepts each connection and closes
// it at once, as a server whose pods are being replaced: every connection
// attempt fails. Attempts receives one value per attempt (dropped when
// the test does not keep up); Stop frees it, so a server can listen on
// the same address.
type Closing struct {
	Addr     string
	Attempts <-chan struct{}

	ln   net.Listener
	done chan struct{}
}

// ClosingAddr starts a Closing address; it stops when tb ends, at the
// latest.
func ClosingAddr(tb testing.TB) *Closing {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	attempts := make(chan struct{}, 64)
	c := &Closing{Addr: ln.Addr().String(), Attempts: attempts, ln: ln, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
			select {
			case attempts <- struct{}{}:
			default:
			}
		}
	}()
	tb.Cleanup(c.Stop)
	return c
}

// Stop stops accepting on the address and returns once it is free.
// Safe to call more than once.
func (c *Closing) Stop() {
	c.ln.Close()
	<-c.done
}

// Freezable is a loopback address that forwards connections to a server
// and can freeze them, as a process paused by SIGSTOP or a node that
// froze: while frozen, connections stay open and bytes sent on them are
// taken but not passed on (neither way), and new connections are accepted
// but not forwarded until Thaw. Unlike a server whose handlers hang, a
// frozen one answers nothing at all, not even HTTP/2 pings. Safe for
// concurrent use; it stops when tb ends.
type Freezable struct {
	Addr string

	mu     sync.Mutex
	thawed chan struct{} // guarded by mu: closed while not frozen
	conns  []net.Conn    // guarded by mu
	closed bool          // guarded by mu
}

// FreezableAddr starts a Freezable address forwarding to target.
func FreezableAddr(tb testing.TB, target string) *Freezable {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f := &Freezable{Addr: ln.Addr().String(), thawed: make(chan struct{})}
	close(f.thawed)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			if !f.track(in, out) {
				return
			}
			wg.Go(func() { f.pump(out, in) })
			wg.Go(func() { f.pump(in, out) })
		}
	})
	tb.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		f.closed = true
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.Thaw()
		wg.Wait()
	})
	return f
}

func (f *Freezable) track(cs ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	f.conns = append(f.conns, cs...)
	return true
}

// pump copies src to dst, holding what it read while frozen.
func (f *Freezable) pump(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			thawed := f.thawed
			f.mu.Unlock()
			<-thawed
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Freeze stops passing bytes on, either way, until Thaw.
func (f *Freezable) Freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.thawed:
		f.thawed = make(chan struct{})
	default: // already frozen
	}
}

// Thaw passes on what was held and everything after it.
func (f *Freezable) Thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case <-f.thawed:
	default:
		close(f.thawed)
	}
}

// Cuttable is a loopback address that forwards connections to a server
// until Cut, as the path to it through a gateway or proxy: Cut closes the
// connections it forwards and from then on accepts new ones and holds
// them, never answered, as a gateway whose upstream is unreachable does;
// Heal forwards new connections again, while the ones held stay held.
// Safe for concurrent use; it stops when tb ends.
type Cuttable struct {
	Addr string

	mu    sync.Mutex
	isCut bool       // guarded by mu
	held  int        // guarded by mu: connections accepted while cut
	conns []net.Conn // guarded by mu
}

// CuttableAddr starts a Cuttable address forwarding to target.
func CuttableAddr(tb testing.TB, target string) *Cuttable {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Cuttable{Addr: ln.Addr().String()}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, in)
			if p.isCut {
				p.held++
				p.mu.Unlock()
				continue
			}
			p.mu.Unlock()
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, out)
			p.mu.Unlock()
			wg.Go(func() { io.Copy(out, in); out.Close() })
			wg.Go(func() { io.Copy(in, out); in.Close() })
		}
	})
	tb.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	return p
}

// Cut closes the connections forwarded so far and holds new ones.
func (p *Cuttable) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = true
	for _, c := range p.conns {
		c.Close()
	}
}

// Heal forwards new connections again; those held while cut stay held.
func (p *Cuttable) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = false
}

// Holding reports whether a connection was accepted while cut.
func (p *Cuttable) Holding() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held > 0
}
