package agent_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
)

// TestDeclaredOversizeBodyIsRefusedAtOnce: a request whose Content-Length
// announces more than MaxBodyBytes is answered 413 as soon as its headers
// are read, whatever part of the body follows: the agent neither waits for
// the announced body (it answered 408 once RequestReadTimeout had passed,
// counted abandoned) nor asks a caller that expects 100-continue to send
// it. It is counted invalid, as a body found oversize is, and the answer
// closes the connection, whose unread body cannot precede another request.
func TestDeclaredOversizeBodyIsRefusedAtOnce(t *testing.T) {
	cfg := regiontest.MustConfig(t, quietConfig)
	r, _ := region(t, cfg)
	// A read timeout far beyond the test's patience: an answer that
	// waited for the body could only come after it.
	a := startAgent(t, r.Addr, agent.StaticConfig{C: cfg}, func(o *agent.Options) { o.RequestReadTimeout = time.Hour })
	const patience = time.Minute // an answer at once, on a loaded machine
	const small = `{"tenant":"acme","class":"read"}`
	cases := []struct {
		name     string
		declared int
		headers  string
	}{
		{"100 MB announced, a small body sent", 100_000_000, ""},
		{"one byte over the limit announced", agent.MaxBodyBytes + 1, ""},
		{"an announced size the server would otherwise read on to drain", 200 << 10, ""},
		{"100-continue expected", 100_000_000, "Expect: 100-continue\r\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", a.HTTPAddr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			body := small
			if tc.headers != "" {
				body = "" // the caller waits for 100 Continue before it sends
			}
			req := fmt.Sprintf("POST /v1/allow HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s",
				tc.declared, tc.headers, body)
			if _, err := io.WriteString(conn, req); err != nil {
				t.Fatal(err)
			}
			conn.SetReadDeadline(time.Now().Add(patience))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("no answer %v after the headers announced a %d-byte body", patience, tc.declared)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode == http.StatusContinue {
				t.Fatalf("answered 100 Continue: asked for a %d-byte body it refuses", tc.declared)
			}
			var e agent.ErrorResponse
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("%d answer is not a JSON error: %v", resp.StatusCode, err)
			}
			want := fmt.Sprintf("body exceeds %d bytes (its Content-Length is %d)", agent.MaxBodyBytes, tc.declared)
			if resp.StatusCode != http.StatusRequestEntityTooLarge || e.Error != want {
				t.Errorf("got %d %+v; want 413 %q", resp.StatusCode, e, want)
			}
			if !resp.Close {
				t.Errorf("the 413 leaves the connection open (Connection: %q) with an unread body on it", resp.Header.Get("Connection"))
			}
		})
	}
	if got := outcomeCounts(t, a.Registry()); got["invalid"] != float64(len(cases)) || got["abandoned"] != 0 {
		t.Errorf("requests by outcome %v; want the %d refused ones invalid", got, len(cases))
	}
	// A body that turns out too big, with no size announced (sent in
	// chunks), is still refused as it is read.
	body := `{"tenant":"` + strings.Repeat("a", agent.MaxBodyBytes) + `","class":"read"}`
	resp, err := httpClient(t).Post("http://"+a.HTTPAddr()+"/v1/allow", "application/json", io.MultiReader(strings.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("an oversize body sent in chunks: %d; want 413", resp.StatusCode)
	}
}
