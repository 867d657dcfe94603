package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/configstore"
)

// mainEnv makes the test binary run main, so tests can run the command as
// a process without building it.
const mainEnv = "SLUICE_TEST_RUN_AGENT_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

const agentConfig = `
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {std: {read: {rate: 100/s, burst: 50}}}
default_tier: std
envoy: {descriptors: [{domain: sluice, tenant_key: tenant, class_key: class}]}
`

// startedAddrs waits for the "agent started" line in a running agent's
// log and returns the addresses it bound (its flags ask for port 0, so no
// other process can take a port the test picked before the agent binds
// it). It fails the test with the log when the agent exits first.
func startedAddrs(t *testing.T, log *logtest.Buffer, exited chan error) map[string]string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, line := range strings.Split(log.String(), "\n") {
			if !strings.Contains(line, `msg="agent started"`) {
				continue
			}
			addrs := map[string]string{}
			for _, field := range strings.Fields(line) {
				if k, v, ok := strings.Cut(field, "="); ok {
					addrs[k] = v
				}
			}
			return addrs
		}
		select {
		case err := <-exited:
			t.Fatalf("agent exited before serving: %v\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not start:\n%s", log.String())
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
}

// command is the test binary set up to run main with args.
func command(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), exe, args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	return cmd
}

func TestVersionAndHelpExitZero(t *testing.T) {
	out, err := command(t, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "agent ") {
		t.Errorf("--version: %q, %v; want a line starting with \"agent \"", out, err)
	}
	if err := command(t, "-h").Run(); err != nil {
		t.Errorf("-h: %v; want exit 0", err)
	}
}

func TestMissingSettingsAreNamed(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfgFile, []byte(agentConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"-config", cfgFile}, "agent: -region-addr is required"},
		{[]string{"-region-addr", "127.0.0.1:1"}, "agent: no config: pass -etcd-endpoints"},
		{[]string{"-region-addr", "127.0.0.1:1", "-config", cfgFile, "-etcd-endpoints", "127.0.0.1:2"}, "exclusive"},
		{[]string{"-region-addr", "127.0.0.1:1", "-config", filepath.Join(t.TempDir(), "none.yaml")}, "no such file"},
		{[]string{"-log-level", "loud"}, "log level loud"},
		{[]string{"-region-addr", "127.0.0.1:1", "-config", cfgFile, "-breaker-timeout", "-1s"}, "agent: -breaker-timeout -1s must be positive"},
		{[]string{"-region-addr", "127.0.0.1:1", "-config", cfgFile, "-max-inflight-per-connection", "-1"},
			"agent: -max-inflight-per-connection -1 must be at least 64"},
	} {
		var stderr bytes.Buffer
		cmd := command(t, tc.args...)
		cmd.Stderr = &stderr
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(stderr.String(), tc.says) {
			t.Errorf("%v: %v, stderr %q; want exit 1 saying %q", tc.args, err, stderr.String(), tc.says)
		}
		if strings.Count(stderr.String(), "agent: ") > 1 {
			t.Errorf("%v: stderr %q names the command more than once", tc.args, stderr.String())
		}
	}
}

// TestServesUntilSIGTERM runs the command as a process beside a real
// regional service: it answers POST /v1/allow and /metrics on the ports
// its flags name, bounds Envoy calls as -max-inflight-per-connection says,
// and SIGTERM ends it with exit 0 after it released its
// tokens.
func TestServesUntilSIGTERM(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfgFile, []byte(agentConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	r := regiontest.Start(t, regiontest.MustConfig(t, agentConfig), "local")
	cmd, exited, stderr, addrs := startAgent(t, "-region", "local", "-region-addr", r.Addr, "-config", cfgFile, "-listen", "127.0.0.1:0",
		"-http-listen", "127.0.0.1:0", "-metrics-listen", "127.0.0.1:0", "-log-level", "info",
		"-max-inflight-per-connection", "4096",
		// A loaded machine can hold the first Acquire past the default
		// 50ms; this decision is meant to come from a lease.
		"-breaker-timeout", "10s")
	httpAddr, metricsAddr := addrs["http"], addrs["metrics"]
	// The start line names the region by its config name and its
	// address apart (it logged the address as the region).
	if addrs["region"] != "local" || addrs["region_addr"] != r.Addr {
		t.Errorf("agent started with region=%q region_addr=%q; want local and %s", addrs["region"], addrs["region_addr"], r.Addr)
	}

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	web := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := web.Post("http://"+httpAddr+"/v1/allow", "application/json", strings.NewReader(`{"tenant":"acme","class":"read","cost":5}`))
	if err != nil {
		t.Fatalf("POST /v1/allow: %v\n%s", err, stderr.String())
	}
	var out agent.AllowResponse
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !out.Allowed || out.Limit != 50 {
		t.Errorf("POST /v1/allow: %d %+v %v; want 200, allowed, limit 50", resp.StatusCode, out, err)
	}
	body := metrictest.Scrape(t, "http://"+metricsAddr+"/metrics")
	for _, name := range []string{"sluice_agent_http_requests_total", "sluice_client_tokens_held", "sluice_envoy_request_duration_seconds", "go_goroutines",
		// The request bounds, the one the flag set among them.
		`sluice_rpc_bound{bound="descriptors_per_request"} 64`, `sluice_rpc_bound{bound="inflight_per_connection"} 4096`} {
		if !strings.Contains(body, name) {
			t.Errorf("/metrics has no %s", name)
		}
	}

	terminate(t, cmd, exited, stderr)
	if !strings.Contains(stderr.String(), "agent stopped") || strings.Contains(stderr.String(), "releasing leased tokens failed") {
		t.Errorf("log after SIGTERM:\n%s\nwant a clean stop with the tokens released", stderr.String())
	}
}

// TestConfigWaitSaysWhatTheAgentServes: with -etcd-endpoints, an agent
// that has no config once -config-wait has passed says why, telling an
// etcd that answers but holds no config from an etcd it cannot reach, and
// what it does meanwhile, which is what it does: it answers 503 and is
// not ready. It said it ran "on the built-in fallback", which it never
// serves, and sent the operator of an unreachable etcd to sluicectl apply,
// which needs the same etcd.
func TestConfigWaitSaysWhatTheAgentServes(t *testing.T) {
	srv := etcdtest.Start(t)
	// Accepts connections and never answers: an etcd that cannot be
	// reached, on a port no other process can take meanwhile.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for _, tc := range []struct {
		name      string
		endpoints string
		says      []string
		never     []string
	}{
		{"etcd holds no config", strings.Join(srv.Endpoints(), ","),
			[]string{`level=WARN msg="etcd holds no config: serving without one, answering 503 (HTTP) and UNAVAILABLE (gRPC), not ready, until one is applied with sluicectl apply"`,
				"key=/nothing/config"},
			[]string{"fallback", "not reachable"}},
		{"etcd not reachable", silent.Addr().String(),
			[]string{`level=WARN msg="etcd not reachable: serving without a config, answering 503 (HTTP) and UNAVAILABLE (gRPC), not ready, until etcd answers with one; the config watch keeps trying"`,
				"key=/nothing/config", "error="},
			[]string{"fallback", "sluicectl", "holds no config"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd, exited, stderr, addrs := startAgent(t, "-region-addr", "127.0.0.1:1", "-etcd-endpoints", tc.endpoints, "-etcd-prefix", "/nothing",
				"-config-wait", "1s", "-listen", "127.0.0.1:0", "-http-listen", "127.0.0.1:0", "-metrics-listen", "127.0.0.1:0",
				"-log-level", "info")
			log := stderr.String()
			for _, want := range tc.says {
				if !strings.Contains(log, want) {
					t.Errorf("the log lacks %q:\n%s", want, log)
				}
			}
			for _, wrong := range tc.never {
				if strings.Contains(log, wrong) {
					t.Errorf("the log says %q:\n%s", wrong, log)
				}
			}
			if tc.name == "etcd not reachable" {
				// The watcher's own line, once its read fails (bounded
				// by 5s): it has no live config to keep.
				deadline := time.Now().Add(time.Minute)
				for !strings.Contains(stderr.String(), "config watch interrupted") {
					if time.Now().After(deadline) {
						t.Fatalf("no config watch interrupted line within a minute:\n%s", stderr.String())
					}
					time.Sleep(20 * time.Millisecond) // polling with a deadline
				}
				if log := stderr.String(); strings.Contains(log, "live config kept") {
					t.Errorf("the watcher says it kept a live config the agent never had:\n%s", log)
				}
			}
			// What it said it does.
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			web := &http.Client{Transport: tr, Timeout: 30 * time.Second}
			resp, err := web.Post("http://"+addrs["http"]+"/v1/allow", "application/json", strings.NewReader(`{"tenant":"acme","class":"read"}`))
			if err != nil {
				t.Fatal(err)
			}
			var e agent.ErrorResponse
			err = json.NewDecoder(resp.Body).Decode(&e)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusServiceUnavailable || e.Error != "no config loaded yet" {
				t.Errorf("POST /v1/allow: %d %+v %v; want 503, no config loaded yet", resp.StatusCode, e, err)
			}
			resp, err = web.Get("http://" + addrs["metrics"] + "/healthz")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("/healthz: %d; want 503 (not ready)", resp.StatusCode)
			}

			terminate(t, cmd, exited, stderr)
		})
	}
}

// startAgent starts the agent process with args, its log in the buffer
// returned, and waits until it serves: exited carries its Wait's error,
// addrs its listeners by name (startedAddrs).
func startAgent(t *testing.T, args ...string) (cmd *exec.Cmd, exited chan error, stderr *logtest.Buffer, addrs map[string]string) {
	t.Helper()
	stderr = &logtest.Buffer{}
	cmd = command(t, args...)
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return cmd, exited, stderr, startedAddrs(t, stderr, exited)
}

// terminate sends the agent process SIGTERM and waits, up to 30 s, for it
// to exit 0 (exited carries its Wait's error); stderr is its log.
func terminate(t *testing.T, cmd *exec.Cmd, exited <-chan error, stderr *logtest.Buffer) {
	t.Helper()
	stopWith(t, syscall.SIGTERM, cmd, exited, stderr)
}

// stopWith is terminate with signal sig.
func stopWith(t *testing.T, sig syscall.Signal, cmd *exec.Cmd, exited <-chan error, stderr *logtest.Buffer) {
	t.Helper()
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after %v: %v; want exit 0\n%s", sig, err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30s after %v\n%s", sig, stderr.String())
	}
}

// TestSIGHUPStopsLikeSIGTERM: an agent whose terminal or supervisor hangs
// up drains and returns its leased tokens to the region, as on SIGTERM.
// SIGHUP's default action ended it at once (exit 129): its tokens stayed
// out until their lease expired.
func TestSIGHUPStopsLikeSIGTERM(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfgFile, []byte(agentConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	r := regiontest.Start(t, regiontest.MustConfig(t, agentConfig), "local")
	cmd, exited, stderr, addrs := startAgent(t, "-region", "local", "-region-addr", r.Addr, "-config", cfgFile, "-listen", "127.0.0.1:0",
		"-http-listen", "127.0.0.1:0", "-metrics-listen", "off", "-log-level", "info", "-breaker-timeout", "10s")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	web := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := web.Post("http://"+addrs["http"]+"/v1/allow", "application/json", strings.NewReader(`{"tenant":"acme","class":"read","cost":5}`))
	if err != nil {
		t.Fatalf("POST /v1/allow: %v\n%s", err, stderr.String())
	}
	resp.Body.Close()
	stopWith(t, syscall.SIGHUP, cmd, exited, stderr)
	if !strings.Contains(stderr.String(), "agent stopped") || strings.Contains(stderr.String(), "releasing leased tokens failed") {
		t.Errorf("log after SIGHUP:\n%s\nwant a clean stop with the tokens released", stderr.String())
	}
}

// TestStartsOnTheNewestValidConfigWhenTheStoredOneIsRefused: an agent
// started while the config stored in etcd is refused (a bad document
// written past sluicectl) runs the newest valid config in etcd's history,
// the one the running daemons kept, as the regional and global daemons
// do; it answered 503 "no config loaded yet" until a good config was
// applied. With no valid config in the history it says so at ERROR, with
// the fix, and serves without one.
func TestStartsOnTheNewestValidConfigWhenTheStoredOneIsRefused(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	ctx := t.Context()
	r := regiontest.Start(t, regiontest.MustConfig(t, agentConfig), "local")
	kept := configstore.NewStore(cli, "/kept")
	good, err := kept.Apply(ctx, regiontest.MustConfig(t, agentConfig), 0)
	if err != nil {
		t.Fatal(err)
	}
	const refused = "regions: {}\n"
	if _, err := cli.Put(ctx, kept.Key(), refused); err != nil {
		t.Fatal(err)
	}
	never := configstore.NewStore(cli, "/never")
	if _, err := cli.Put(ctx, never.Key(), refused); err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	web := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	allow := func(addrs map[string]string) (int, agent.AllowResponse, string) {
		t.Helper()
		resp, err := web.Post("http://"+addrs["http"]+"/v1/allow", "application/json", strings.NewReader(`{"tenant":"acme","class":"read"}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body bytes.Buffer
		body.ReadFrom(resp.Body)
		var out agent.AllowResponse
		json.Unmarshal(body.Bytes(), &out)
		return resp.StatusCode, out, body.String()
	}
	start := func(prefix string) (*exec.Cmd, chan error, *logtest.Buffer, map[string]string) {
		// The wait ends as soon as a config is live; -breaker-timeout
		// keeps a loaded machine's first Acquire from the failure policy.
		return startAgent(t, "-region", "local", "-region-addr", r.Addr, "-etcd-endpoints", strings.Join(srv.Endpoints(), ","),
			"-etcd-prefix", prefix, "-config-wait", "30s", "-breaker-timeout", "10s",
			"-listen", "127.0.0.1:0", "-http-listen", "127.0.0.1:0", "-metrics-listen", "127.0.0.1:0", "-log-level", "info")
	}

	t.Run("history holds a valid config", func(t *testing.T) {
		cmd, exited, stderr, addrs := start("/kept")
		if code, out, body := allow(addrs); code != http.StatusOK || !out.Allowed || out.Limit != 50 {
			t.Errorf("POST /v1/allow: %d %s; want 200, allowed, limit 50 (the config kept)\n%s", code, body, stderr.String())
		}
		log := stderr.String()
		if !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "newest valid config in etcd's history") ||
			!strings.Contains(log, fmt.Sprintf("revision=%d", good)) || !strings.Contains(log, "sluicectl apply") {
			t.Errorf("the start on revision %d is not logged at ERROR with the fix:\n%s", good, log)
		}
		metrics := metrictest.Scrape(t, "http://"+addrs["metrics"]+"/metrics")
		for _, want := range []string{"sluice_config_started_on_older_revision_total 1", fmt.Sprintf("sluice_config_last_applied_revision %d", good)} {
			if !strings.Contains(metrics, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		terminate(t, cmd, exited, stderr)
	})

	t.Run("history holds none", func(t *testing.T) {
		cmd, exited, stderr, addrs := start("/never")
		if code, _, body := allow(addrs); code != http.StatusServiceUnavailable || !strings.Contains(body, "no config loaded yet") {
			t.Errorf("POST /v1/allow: %d %s; want 503, no config loaded yet", code, body)
		}
		deadline := time.Now().Add(30 * time.Second)
		for !strings.Contains(stderr.String(), "etcd's history holds no valid one") {
			if time.Now().After(deadline) {
				t.Fatalf("no ERROR saying the history holds no valid config within 30s:\n%s", stderr.String())
			}
			time.Sleep(20 * time.Millisecond) // polling with a deadline
		}
		if log := stderr.String(); !strings.Contains(log, "sluicectl apply") || !strings.Contains(log, "key=/never/config") {
			t.Errorf("the ERROR names neither the key nor the fix:\n%s", log)
		}
		terminate(t, cmd, exited, stderr)
	})
}

// TestStopWhileAwaitingEtcdsConfig: an agent stopped while it still waits
// for etcd's config (-config-wait) stops there, exit 0, as the regional
// and global daemons do. It went on to bind its ports and log "agent
// started" after the signal, then stopped.
func TestStopWhileAwaitingEtcdsConfig(t *testing.T) {
	// Accepts connections and never answers: an etcd that cannot be
	// reached, on a port no other process can take meanwhile.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	stderr := &logtest.Buffer{}
	cmd := command(t, "-region-addr", "127.0.0.1:1", "-etcd-endpoints", silent.Addr().String(), "-etcd-prefix", "/nothing",
		"-config-wait", "10m", "-listen", "127.0.0.1:0", "-http-listen", "127.0.0.1:0", "-metrics-listen", "127.0.0.1:0",
		"-log-level", "info")
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The watcher's line once its first read fails (bounded by 5s): the
	// agent is past its signal handler and waiting for the config.
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(stderr.String(), "config watch interrupted") {
		select {
		case err := <-exited:
			t.Fatalf("agent exited while waiting for its config: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no config watch interrupted line within a minute:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline
	}
	terminate(t, cmd, exited, stderr)
	log := stderr.String()
	if !strings.Contains(log, `msg="stopped before start: etcd's config was still awaited"`) || strings.Contains(log, "agent started") {
		t.Errorf("log after SIGTERM while awaiting etcd's config:\n%s\nwant it stopped before start, never started", log)
	}
}
