package etcdtest

import (
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/sluicehq/sluice/internal/embedetcd"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// dialTimeout bounds one forwarded connection's dial to etcd.
const dialTimeout = 2 * time.Second

// Server is one embedded etcd member with a stable client endpoint. Safe
// for concurrent use.
type Server struct {
	t    testing.TB
	dir  string // data dir; guarded by life
	main *Link
	log  *zap.Logger
	// over is set once the test's cleanup has run; etcd output after that
	// point is dropped instead of reaching a finished test.
	over atomic.Bool

	life sync.Mutex // serialises Stop and Restart; guards etcd
	etcd *embed.Etcd

	mu      sync.Mutex // guards backend, gen, links and every Link's cut, closed, conns and hold
	backend string     // host:port of the running etcd's client listener; "" while stopped
	gen     uint64     // bumped by every Stop, so a connection dialed to a stopped etcd is dropped
	links   []*Link
}

// Start runs an etcd member on loopback ports chosen by the kernel, with its
// data in a fresh t.TempDir, and waits until it serves. Everything is torn
// down at test cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir()}
	s.log = zap.New(zapcore.NewCore(
		zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
		zapcore.AddSync(testLogWriter{s}),
		zapcore.ErrorLevel))
	s.life.Lock()
	err := s.startLocked()
	s.life.Unlock()
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	main, err := s.newLink()
	if err != nil {
		s.Stop()
		t.Fatalf("etcdtest: %v", err)
	}
	s.main = main
	t.Cleanup(func() {
		s.Stop()
		s.mu.Lock()
		links := append([]*Link(nil), s.links...)
		s.mu.Unlock()
		for _, l := range links {
			l.close()
		}
		s.over.Store(true)
	})
	return s
}

// Endpoints are the client endpoints; they stay the same across Restart.
func (s *Server) Endpoints() []string { return s.main.Endpoints() }

// Client returns a client of the server's main endpoint, closed at t's
// cleanup. It reconnects quickly after Restart.
func (s *Server) Client(t testing.TB) *clientv3.Client { return s.main.Client(t) }

// Stop shuts etcd down after severing every client connection at once, so
// clients see what a crash looks like from the network while the data dir
// stays consistent for Restart. Idempotent.
func (s *Server) Stop() {
	s.life.Lock()
	defer s.life.Unlock()
	s.stopLocked()
}

// Restart stops etcd if it runs and starts it again on the same data dir;
// the endpoints do not change and the data survives.
func (s *Server) Restart() {
	s.t.Helper()
	s.life.Lock()
	defer s.life.Unlock()
	s.stopLocked()
	if err := s.startLocked(); err != nil {
		s.t.Fatalf("etcdtest: restart: %v", err)
	}
}

// Backup stops etcd, copies its data, and starts it again on the same
// data dir; the endpoints do not change. restore stops etcd and starts it
// on that copy: etcd as restored from a backup taken then, its revision
// back where it was. Clients see a restart and reconnect.
func (s *Server) Backup() (restore func()) {
	s.t.Helper()
	copyDir := s.t.TempDir()
	s.life.Lock()
	defer s.life.Unlock()
	s.stopLocked()
	err := os.CopyFS(copyDir, os.DirFS(s.dir))
	if err == nil {
		err = os.Chmod(copyDir, 0o700)
	}
	if err != nil {
		s.t.Fatalf("etcdtest: backup: %v", err)
	}
	if err := s.startLocked(); err != nil {
		s.t.Fatalf("etcdtest: restart after backup: %v", err)
	}
	return func() {
		s.t.Helper()
		s.life.Lock()
		defer s.life.Unlock()
		s.stopLocked()
		s.dir = copyDir
		if err := s.startLocked(); err != nil {
			s.t.Fatalf("etcdtest: restore: %v", err)
		}
	}
}

func (s *Server) startLocked() error {
	e, err := embedetcd.Start("sluice-test", s.dir, s.log)
	if err != nil {
		return err
	}
	s.etcd = e
	s.mu.Lock()
	s.backend = e.Clients[0].Addr().String()
	s.mu.Unlock()
	return nil
}

func (s *Server) stopLocked() {
	if s.etcd == nil {
		return
	}
	s.mu.Lock()
	s.backend = ""
	s.gen++
	var conns []net.Conn
	for _, l := range s.links {
		conns = l.takeConnsLocked(conns)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	s.etcd.Close()
	s.etcd = nil
}

// Link is one network path from clients to the server: a loopback listener
// that forwards every connection to etcd. Safe for concurrent use.
type Link struct {
	srv *Server
	ln  net.Listener
	wg  sync.WaitGroup // counts the accept loop and forwarding goroutines

	// Guarded by srv.mu.
	cut     bool
	closed  bool
	refused int // connections refused while cut
	conns   map[net.Conn]struct{}
	// hold is non-nil while the link hangs: forwarding waits for it to
	// close before it passes on another byte.
	hold chan struct{}
	// replies is non-nil while etcd's replies are held (HoldRepliesAfter):
	// only the forwarding from etcd waits for it. armAt > 0 is the size of
	// a client write that starts holding them.
	replies chan struct{}
	armAt   int
}

// Link opens an extra path to the server with its own endpoint, closed at
// t's cleanup. Cutting it leaves every other client untouched.
func (s *Server) Link(t testing.TB) *Link {
	t.Helper()
	l, err := s.newLink()
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(l.close)
	return l
}

func (s *Server) newLink() (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for a client link: %w", err)
	}
	l := &Link{srv: s, ln: ln, conns: make(map[net.Conn]struct{})}
	s.mu.Lock()
	s.links = append(s.links, l)
	s.mu.Unlock()
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Endpoints are the link's client endpoints.
func (l *Link) Endpoints() []string { return []string{l.ln.Addr().String()} }

// Client returns a client that goes through this link, closed at t's
// cleanup. Its reconnect backoff is capped at a quarter second so tests
// recover quickly after Restart or Mend.
func (l *Link) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   l.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{
				BaseDelay:  10 * time.Millisecond,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   250 * time.Millisecond,
			},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		t.Fatalf("etcdtest: new client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Cut severs every connection through the link and refuses new ones until
// Mend, like a network partition between its clients and etcd.
func (l *Link) Cut() {
	s := l.srv
	s.mu.Lock()
	l.cut = true
	l.releaseLocked()
	conns := l.takeConnsLocked(nil)
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Refused is how many connections the link refused while cut: each is one
// attempt of a client to reach etcd again.
func (l *Link) Refused() int {
	l.srv.mu.Lock()
	defer l.srv.mu.Unlock()
	return l.refused
}

// Hang keeps every connection through the link open but lets no byte pass
// until Mend, like an etcd stopped by SIGSTOP or a network that drops
// packets without resetting connections: callers wait instead of failing.
// New connections are accepted and hang too.
func (l *Link) Hang() {
	l.srv.mu.Lock()
	if l.hold == nil {
		l.hold = make(chan struct{})
	}
	l.srv.mu.Unlock()
}

// HoldRepliesAfter lets requests through but holds every reply from etcd,
// until Mend, from the first client write of at least size bytes on: a
// request that reached etcd whose answer is lost on the way back (a
// network that fails after a write, a client that gives up first).
func (l *Link) HoldRepliesAfter(size int) {
	l.srv.mu.Lock()
	l.armAt = size
	l.srv.mu.Unlock()
}

// Mend lets connections through the link again, after Cut, Hang or
// HoldRepliesAfter.
func (l *Link) Mend() {
	l.srv.mu.Lock()
	l.cut = false
	l.releaseLocked()
	l.srv.mu.Unlock()
}

// releaseLocked ends a Hang and held replies. The caller holds srv.mu.
func (l *Link) releaseLocked() {
	if l.hold != nil {
		close(l.hold)
		l.hold = nil
	}
	if l.replies != nil {
		close(l.replies)
		l.replies = nil
	}
	l.armAt = 0
}

// waitFlowing returns once the link does not hang, nor hold replies when
// reply is set.
func (l *Link) waitFlowing(reply bool) {
	for {
		l.srv.mu.Lock()
		hold := l.hold
		if hold == nil && reply {
			hold = l.replies
		}
		l.srv.mu.Unlock()
		if hold == nil {
			return
		}
		<-hold
	}
}

// pump copies src to dst like io.Copy, holding each chunk while the link
// hangs; reply says src is etcd.
func (l *Link) pump(dst, src net.Conn, reply bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l.waitFlowing(reply)
			if !reply {
				l.srv.mu.Lock()
				if l.armAt > 0 && n >= l.armAt && l.replies == nil {
					l.replies, l.armAt = make(chan struct{}), 0
				}
				l.srv.mu.Unlock()
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// takeConnsLocked appends the link's open connections to dst and forgets
// them. The caller holds srv.mu and closes them after unlocking.
func (l *Link) takeConnsLocked(dst []net.Conn) []net.Conn {
	for c := range l.conns {
		dst = append(dst, c)
	}
	clear(l.conns)
	return dst
}

func (l *Link) close() {
	s := l.srv
	s.mu.Lock()
	if l.closed {
		s.mu.Unlock()
		return
	}
	l.closed = true
	l.releaseLocked()
	conns := l.takeConnsLocked(nil)
	for i, other := range s.links {
		if other == l {
			s.links = append(s.links[:i], s.links[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	l.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	l.wg.Wait()
}

func (l *Link) acceptLoop() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // the listener was closed
		}
		l.wg.Add(1)
		go l.forward(c)
	}
}

func (l *Link) forward(client net.Conn) {
	defer l.wg.Done()
	s := l.srv
	s.mu.Lock()
	backend, gen, refuse := s.backend, s.gen, l.cut || l.closed
	if l.cut {
		l.refused++
	}
	s.mu.Unlock()
	if refuse || backend == "" {
		client.Close()
		return
	}
	server, err := net.DialTimeout("tcp", backend, dialTimeout)
	if err != nil {
		client.Close()
		return
	}
	s.mu.Lock()
	if l.cut || l.closed || s.gen != gen {
		// Cut, closed or stopped while dialing: the takers already ran.
		s.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	l.conns[client] = struct{}{}
	l.conns[server] = struct{}{}
	s.mu.Unlock()

	done := make(chan struct{}, 2)
	go func() { l.pump(server, client, false); done <- struct{}{} }()
	go func() { l.pump(client, server, true); done <- struct{}{} }()
	<-done
	client.Close()
	server.Close()
	<-done
	s.mu.Lock()
	delete(l.conns, client)
	delete(l.conns, server)
	s.mu.Unlock()
}

// testLogWriter sends etcd's log lines to the test log, shown only for
// failing tests or with -v.
type testLogWriter struct{ s *Server }

func (w testLogWriter) Write(p []byte) (int, error) {
	if !w.s.over.Load() {
		w.s.t.Logf("etcd: %s", strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}
