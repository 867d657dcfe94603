package memlisten_test

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/memlisten"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// waitBlocked polls the goroutine dump until a goroutine is parked in a
// select inside fn (e.g. "memlisten.(*Listener).Accept"), so a test closes
// the listener while the call is pending rather than before it starts.
func waitBlocked(t *testing.T, fn string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "[select") && strings.Contains(g, fn+"(") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine blocked in %s:\n%s", fn, buf[:n])
		}
		runtime.Gosched()
	}
}

func TestDialAndAcceptShareOneConnection(t *testing.T) {
	l := memlisten.New()
	defer l.Close()
	type dialed struct {
		c   net.Conn
		err error
	}
	ch := make(chan dialed, 1)
	go func() {
		c, err := l.Dial(context.Background())
		ch <- dialed{c, err}
	}()
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	d := <-ch
	if d.err != nil {
		t.Fatal(d.err)
	}
	client := d.c
	go func() {
		client.Write([]byte("ping"))
	}()
	got := make([]byte, 4)
	if _, err := io.ReadFull(server, got); err != nil || string(got) != "ping" {
		t.Fatalf("server read %q, %v; want ping", got, err)
	}
	go func() {
		server.Write([]byte("pong"))
		server.Close()
	}()
	all, err := io.ReadAll(client)
	if err != nil || string(all) != "pong" {
		t.Fatalf("client read %q, %v; want pong then EOF", all, err)
	}
	client.Close()
	if l.Addr().Network() != "memory" || l.Addr().String() != "memory" {
		t.Errorf("Addr = %v/%v, want memory/memory", l.Addr().Network(), l.Addr())
	}
}

func TestClosedListenerRefusesAcceptAndDial(t *testing.T) {
	l := memlisten.New()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if c, err := l.Accept(); !errors.Is(err, net.ErrClosed) || c != nil {
		t.Errorf("Accept after Close = %v, %v; want nil, net.ErrClosed", c, err)
	}
	if c, err := l.Dial(context.Background()); !errors.Is(err, net.ErrClosed) || c != nil {
		t.Errorf("Dial after Close = %v, %v; want nil, net.ErrClosed", c, err)
	}
}

func TestCloseEndsPendingAccepts(t *testing.T) {
	l := memlisten.New()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			c, err := l.Accept()
			if c != nil {
				c.Close()
			}
			errs <- err
		}()
	}
	waitBlocked(t, "memlisten.(*Listener).Accept")
	l.Close()
	for range 2 {
		if err := <-errs; !errors.Is(err, memlisten.ErrClosed) {
			t.Errorf("pending Accept returned %v, want ErrClosed", err)
		}
	}
}

func TestCloseEndsPendingDials(t *testing.T) {
	l := memlisten.New()
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			c, err := l.Dial(context.Background())
			if c != nil {
				c.Close()
			}
			errs <- err
		}()
	}
	waitBlocked(t, "memlisten.(*Listener).Dial")
	l.Close()
	for range 2 {
		if err := <-errs; !errors.Is(err, memlisten.ErrClosed) {
			t.Errorf("pending Dial returned %v, want ErrClosed", err)
		}
	}
}

func TestDialEndsWithItsContext(t *testing.T) {
	l := memlisten.New()
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 1)
	go func() {
		_, err := l.Dial(ctx)
		errs <- err
	}()
	waitBlocked(t, "memlisten.(*Listener).Dial")
	cancel()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial returned %v, want context.Canceled", err)
	}
	// The given-up connection was not left for a later Accept.
	go func() {
		c, err := l.Dial(context.Background())
		if err == nil {
			c.Write([]byte("x"))
			c.Close()
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, 1)
	if _, err := c.Read(b); err != nil || b[0] != 'x' {
		t.Fatalf("Accept after a canceled Dial got %q, %v; want the next Dial's connection", b, err)
	}
}

// TestGRPCServesAndStopsOverIt is the listener's use: a gRPC server
// serves on it, a client dials through it, and GracefulStop ends Serve
// with no error and no goroutine left (TestMain checks).
func TestGRPCServesAndStopsOverIt(t *testing.T) {
	l := memlisten.New()
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	cc, err := grpc.NewClient("passthrough:///memory",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.Dial(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check = %v, %v; want SERVING", resp, err)
	}
	cc.Close()
	srv.GracefulStop()
	if err := <-served; err != nil {
		t.Fatalf("Serve returned %v after GracefulStop, want nil", err)
	}
	if _, err := l.Dial(context.Background()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Dial after the server stopped = %v, want net.ErrClosed", err)
	}
}
