package devcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/config"
)

// TestDevModeRunsAnAgent: dev mode's banner names the local agent and its
// curl example, pasted in another directory, is answered by the agent
// from its leases.
func TestDevModeRunsAnAgent(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is needed to run the banner's example")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- RunDev(ctx, DevOptions{Config: config.Default(), Region: "us-east", Out: w,
			Listen: ListenAddrs{GRPC: "127.0.0.1:0", HTTP: "127.0.0.1:0"}})
		w.Close()
	}()
	defer func() {
		cancel()
		go io.Copy(io.Discard, r)
		if err := <-done; err != nil {
			t.Errorf("RunDev: %v", err)
		}
	}()

	var example string
	sawAgent := false
	lines := bufio.NewScanner(r)
	for lines.Scan() {
		l := lines.Text()
		sawAgent = sawAgent || strings.HasPrefix(l, "  agent ")
		if strings.Contains(l, "/v1/allow -d") {
			example = strings.TrimSpace(l)
		}
		if strings.Contains(l, "Ctrl-C") {
			break
		}
	}
	if !sawAgent || example == "" {
		t.Fatalf("the banner names no agent or no /v1/allow example (agent line %v, example %q)", sawAgent, example)
	}
	cmd := exec.Command("sh", "-c", example)
	cmd.Dir = t.TempDir()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v", example, err)
	}
	var resp agent.AllowResponse
	if err := json.Unmarshal(out, &resp); err != nil || !resp.Allowed {
		t.Errorf("%s answered %s (%v); want an allowed decision", example, out, err)
	}
}
