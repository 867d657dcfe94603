package agent_test

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
)

// TestHTTPCallerThatStopsSendingIsCutOff: a caller of /v1/allow that
// announces a body and stops sending part-way has its connection closed
// once RequestReadTimeout has passed, instead of holding it (and a
// goroutine) for as long as it likes.
func TestHTTPCallerThatStopsSendingIsCutOff(t *testing.T) {
	const timeout = 200 * time.Millisecond
	cfg := regiontest.MustConfig(t, quietConfig)
	r, _ := region(t, cfg)
	a, err := agent.Start(agent.Options{
		RegionAddr: r.Addr, Config: agent.StaticConfig{C: cfg},
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		RequestReadTimeout: timeout,
		Logger:             slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	conn, err := net.Dial("tcp", a.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /v1/allow HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	// Far beyond the timeout, so a loaded machine cannot fail the test;
	// before the bound the connection stayed open past a minute.
	conn.SetReadDeadline(time.Now().Add(100 * timeout))
	answer, err := io.ReadAll(conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the connection of a caller that stopped sending its body is still open %v after it stopped", 100*timeout)
	}
	// Answered 408 in words, not the socket's error (it named both
	// addresses and "i/o timeout" in a 400), and counted abandoned, not
	// invalid: nothing the caller sent was wrong.
	if !strings.HasPrefix(string(answer), "HTTP/1.1 408 ") || !strings.Contains(string(answer), "did not arrive in full within the agent's read timeout") || strings.Contains(string(answer), "tcp") {
		t.Errorf("answer to a caller that stopped sending: %q; want 408 saying the body did not arrive in time", answer)
	}
	if got := outcomeCounts(t, a.Registry()); got["abandoned"] != 1 || got["invalid"] != 0 {
		t.Errorf("requests by outcome %v; want the stalled one abandoned", got)
	}
}
