package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// devConfig is the sample deployment (three regions, weights 2:1:1) plus a
// tenant held to 100/s of read, the one the load drives.
const devConfig = `
epoch: 1s
grant_validity: 5s
lease_ttl: 5s
refresh: 1s
regions:
  us-east:  {weight: 2}
  eu-west:  {weight: 1}
  ap-south: {weight: 1}
classes:
  read:   {mode: lease,  on_failure: local}
  export: {mode: strict, on_failure: closed}
tiers:
  free:    {read: {rate: 10/s, burst: 20}, export: {rate: 6/m, burst: 1}}
  pro:     {read: {rate: 2000/s, burst: 4000}, export: {rate: 1/s, burst: 5}}
  hundred: {read: {rate: 100/s, burst: 100}, export: {rate: 1/s, burst: 5}}
tenants:
  acme:  {tier: pro}
  small: {tier: hundred}
default_tier: free
envoy:
  descriptors:
    - {domain: sluice, tenant_key: tenant, class_key: class}
`

// devMode is a running `regional -dev` and what its banner says.
type devMode struct {
	cmd     *exec.Cmd
	lines   chan string
	banner  []string
	grpc    map[string]string // region → LeaseService/RLS address
	metrics map[string]string // region → /metrics URL
	global  string            // the global allocator's address
	// globalMetrics is the global allocator's /metrics URL.
	globalMetrics string
}

// TestDevModeServesTheExampleCall builds the commands once, starts
// `regional -dev` as a subprocess on a three-region config and requires:
// the banner names every region; its sluicectl examples work pasted into a
// shell in another directory; status shows every region live; reflection
// lists the services; the Envoy RLS answers OK; a tenant held to 100/s,
// driven through one region's RLS, is admitted near its whole limit (not
// that region's static share), never above b + r·t, on the daemon's own
// counters; SIGTERM stops it cleanly.
func TestDevModeServesTheExampleCall(t *testing.T) {
	dir := t.TempDir()
	regionalBin := filepath.Join(dir, "regional")
	// One go build for both binaries, with the test's own flags (see
	// buildFlags): its packages come from the build cache. sluicectl lands
	// beside regional, where dev mode finds it for its examples.
	build := append(append([]string{"build"}, buildFlags...), "-o", dir+string(filepath.Separator), ".", "../sluicectl")
	if out, err := exec.Command("go", build...).CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cfgFile := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfgFile, []byte(devConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(devConfig))
	if err != nil {
		t.Fatal(err)
	}

	d := startDev(t, regionalBin, "-dev", "-config", cfgFile, "-log-level", "warn",
		"-listen", "127.0.0.1:0", "-metrics-listen", "127.0.0.1:0")
	for r := range cfg.Regions {
		if d.grpc[r] == "" || d.metrics[r] == "" {
			t.Fatalf("banner does not name region %s's addresses:\n%s", r, strings.Join(d.banner, "\n"))
		}
	}

	// The global allocator's /metrics is in the banner, not only in a log
	// line.
	if d.globalMetrics == "" {
		t.Fatalf("banner does not name the global allocator's /metrics address:\n%s", strings.Join(d.banner, "\n"))
	}
	if body := getBody(t, d.globalMetrics); !strings.Contains(body, "sluice_global_") {
		t.Fatalf("%s serves no sluice_global_* metric:\n%s", d.globalMetrics, body)
	}

	// The printed sluicectl examples, pasted into a shell elsewhere.
	elsewhere := t.TempDir()
	out := d.paste(t, elsewhere, "sluicectl lease ")
	if !strings.Contains(out, "granted 10 of 10 tokens") {
		t.Fatalf("lease example did not get a lease:\n%s", out)
	}
	out = d.paste(t, elsewhere, "sluicectl check ")
	if !strings.Contains(out, "allowed") {
		t.Fatalf("check example was not allowed:\n%s", out)
	}
	if _, err := exec.LookPath("curl"); err == nil {
		out = d.paste(t, elsewhere, "curl ")
		if !strings.Contains(out, "sluice_regional_leader 1") {
			t.Fatalf("curl example does not show the region leader:\n%s", out)
		}
	}
	out = d.paste(t, elsewhere, " status")
	for r := range cfg.Regions {
		if !regexp.MustCompile(`(?m)^` + r + `\s.*\blive\s*$`).MatchString(out) {
			t.Fatalf("status does not show region %s live:\n%s", r, out)
		}
	}
	if strings.Contains(out, "silent") || strings.Contains(out, "DEGRADED") {
		t.Fatalf("status shows a region silent:\n%s", out)
	}

	addr := d.grpc["us-east"]
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Reflection lists the services the banner names.
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	stream.CloseSend()
	var services []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	for _, want := range []string{"sluice.v1.LeaseService", "envoy.service.ratelimit.v3.RateLimitService", "grpc.health.v1.Health"} {
		if !slices.Contains(services, want) {
			t.Fatalf("reflection lists %v, not %s", services, want)
		}
	}

	// The Envoy RLS answers OK for a configured key.
	rls := rlsv3.NewRateLimitServiceClient(conn)
	req := func(tenant string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "sluice", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tenant", Value: tenant}, {Key: "class", Value: "read"}},
		}}}
	}
	if r, err := rls.ShouldRateLimit(ctx, req("acme")); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit = %v, %v; want OK", r, err)
	}
	// The grpcurl examples' requests, as grpcurl would send them.
	grpcurlLine := regexp.MustCompile(`^\s*grpcurl -plaintext -d '(.*)' (\S+) (\S+)$`)
	var calls int
	for _, l := range d.banner {
		m := grpcurlLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		calls++
		ex, err := grpc.NewClient(m[2], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		switch m[3] {
		case "sluice.v1.LeaseService/Check":
			var in sluicev1.CheckRequest
			if err := protojson.Unmarshal([]byte(m[1]), &in); err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			if _, err := sluicev1.NewLeaseServiceClient(ex).Check(ctx, &in); err != nil {
				t.Fatalf("%s: %v", l, err)
			}
		case "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit":
			var in rlsv3.RateLimitRequest
			if err := protojson.Unmarshal([]byte(m[1]), &in); err != nil {
				t.Fatalf("%s: %v", l, err)
			}
			if r, err := rlsv3.NewRateLimitServiceClient(ex).ShouldRateLimit(ctx, &in); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%s: %v, %v; want OK", l, r, err)
			}
		default:
			t.Fatalf("unexpected grpcurl example: %s", l)
		}
		ex.Close()
	}
	if calls != 2 {
		t.Fatalf("banner has %d grpcurl examples, want 2 (LeaseService, RLS)", calls)
	}

	// Once the allocator has learned (it says so), the 100/s tenant
	// through us-east's RLS: the allocator moves the idle regions' shares
	// to us-east. Admissions are read from every region's own counters of
	// OK answers.
	learned := time.After(2*time.Duration(cfg.GrantValidity) + 20*time.Second)
	for waiting := true; waiting; {
		select {
		case l, ok := <-d.lines:
			if !ok {
				t.Fatal("dev mode exited before the allocator learned")
			}
			waiting = !strings.Contains(l, "global allocator has learned")
		case <-learned:
			t.Fatal("dev mode never said the global allocator has learned")
		}
	}
	small := quota.Key{Tenant: "small", Class: "read"}
	res, err := cfg.Resolve(small)
	if err != nil {
		t.Fatal(err)
	}
	rate, burst := res.Limit.Rate, float64(res.Limit.Burst)
	var weights float64
	for _, r := range cfg.Regions {
		weights += float64(r.Weight)
	}
	share := float64(cfg.Regions["us-east"].Weight) / weights
	// The drive runs until the window below is judged; its requests have
	// their own context, as long as the drive may last.
	driveCtx, stopDrive := context.WithCancel(context.Background())
	defer stopDrive()
	before, degraded0 := d.admitted(t), d.degraded(t)
	var sent atomic.Int64
	t0 := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for driveCtx.Err() == nil {
				if _, err := rls.ShouldRateLimit(driveCtx, req("small")); err != nil {
					if driveCtx.Err() == nil {
						t.Errorf("ShouldRateLimit: %v", err)
					}
					return
				}
				sent.Add(1)
			}
		})
	}
	// Capacity moves one to two epochs after the allocator sees the shift
	// (docs/architecture.md), which it sees at a report an epoch after the
	// demand rose. The wait is for that event, with a deadline in us-east's
	// own epoch reports (a starved process runs fewer of them than the wall
	// clock's seconds); the window is judged once us-east holds the grant.
	const maxReports = 30
	reports0 := epochReportsOf(t, d)
	moved := false
	var granted float64 // us-east's granted rate, once moved
	for !moved {
		if rs := d.keyStatus(t, "us-east", small); rs != nil && rs.GetGrantedRate() >= 0.9*rate {
			moved, granted = true, min(rs.GetGrantedRate(), rate)
			break
		}
		if epochReportsOf(t, d)-reports0 > maxReports {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling the allocator, with a deadline in the region's epochs
	}
	var w0 time.Time
	var mid, sentMid, degradedMid float64
	// waitReports waits for n more of us-east's epoch reports.
	waitReports := func(n float64) {
		for r0 := epochReportsOf(t, d); epochReportsOf(t, d)-r0 < n; {
			time.Sleep(20 * time.Millisecond) // counting the region's epochs
		}
	}
	if moved {
		// The grant is the region's at once; its instances' leases (here
		// the RLS's own client) grow to it with their demand readings over
		// a few refreshes: the window opens four of the region's epochs
		// later and is four of them long.
		// The window is the time between the two reads of the counters:
		// a scrape takes a while on a starved machine, so it runs from
		// the end of the first to the start of the second, never longer
		// than what the counters cover.
		waitReports(4)
		mid, sentMid, degradedMid = d.admitted(t), float64(sent.Load()), d.degraded(t)
		w0 = time.Now()
		waitReports(4)
	}
	w1 := time.Now()
	end, degradedEnd := d.admitted(t), d.degraded(t)
	sentEnd := float64(sent.Load())
	elapsed := time.Since(t0)
	stopDrive()
	wg.Wait()
	// Whatever was admitted after end counts against the whole drive.
	// Decisions the class's on_failure policy (local) made while the
	// RLS's own client could not reach its region are outside b + r·t by
	// that policy (docs/architecture.md, failure table); the counter of
	// degraded decisions counts their denials too, so subtracting it
	// leaves at most what the leases admitted.
	final, degraded := d.admitted(t), d.degraded(t)-degraded0
	upper := burst + rate*time.Since(t0).Seconds()
	if admitted := final - before - degraded; admitted > upper {
		t.Fatalf("admitted %.0f from leases (%.0f OK answers, %.0f degraded decisions) > b + r·t = %.0f", admitted, final-before, degraded, upper)
	}
	if offered := sentEnd / elapsed.Seconds(); !moved {
		if offered < rate {
			t.Logf("the load offered %.0f/s, below the key's %.0f/s, and the allocator granted us-east less than 90%% of it within %d of its epoch reports: not saturated, the move is not judged", offered, rate, maxReports)
		} else {
			t.Fatalf("us-east offered %.0f/s was not granted 90%% of %.0f/s within %d of its epoch reports; global status of the key there: %v", offered, rate, maxReports, d.keyStatus(t, "us-east", small))
		}
	} else {
		// Over the window: near what the load offered, up to the whole
		// rate, well above what us-east could admit on its static share.
		// Requests the RLS's own client decided by the on_failure policy
		// (it could not reach its region: a starved process) were not
		// offered to the grant, so they are not counted as offered.
		// The key runs on the grant us-east holds (at least 90% of the
		// rate, the wait above), not on the whole rate.
		inWindow := w1.Sub(w0)
		late, offered, degradedIn := end-mid, sentEnd-sentMid, degradedEnd-degradedMid
		alone := share * (burst + rate*inWindow.Seconds())
		lower := 0.8 * min(granted*inWindow.Seconds(), offered-degradedIn)
		t.Logf("admitted %.0f of %.0f requests in %v; %.0f of %.0f in the %v from four of its epochs after us-east was granted the rate, %.0f of them decided degraded (us-east's static share alone <= %.0f, required >= %.0f)",
			final-before, sentEnd, elapsed.Round(time.Millisecond), late, offered, inWindow.Round(time.Millisecond), degradedIn, alone, lower)
		if late < lower {
			t.Fatalf("admitted %.0f of %.0f offered (%.0f decided degraded) in the last %v < %.0f: the key did not run on its grant", late, offered, degradedIn, inWindow.Round(time.Millisecond), lower)
		}
		if lower <= alone {
			t.Logf("the load offered too little in the window to tell the whole limit from one region's share")
		}
	}

	d.cmd.Process.Signal(syscall.SIGTERM)
	for range d.lines { // drain until the process closes stdout
	}
	if err := d.cmd.Wait(); err != nil {
		t.Fatalf("dev mode did not stop cleanly on SIGTERM: %v", err)
	}
}

// startDev starts the binary and reads its banner (at most 20 s).
func startDev(t *testing.T, bin string, args ...string) *devMode {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	t.Cleanup(http.DefaultClient.CloseIdleConnections) // the /metrics reads' keep-alives
	d := &devMode{cmd: cmd, lines: make(chan string), grpc: map[string]string{}, metrics: map[string]string{}}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			d.lines <- sc.Text()
		}
		close(d.lines)
	}()
	regionLine := regexp.MustCompile(`^\s+region (\S+)\s+(\S+)\s`)
	metricsLine := regexp.MustCompile(`^\s+(\S+)\s+HTTP: /metrics`)
	globalLine := regexp.MustCompile(`^\s+global allocator\s+(\S+)\s`)
	ready := time.After(20 * time.Second)
	region := ""
	for {
		select {
		case l, ok := <-d.lines:
			if !ok {
				t.Fatalf("dev mode exited before its banner ended:\n%s", strings.Join(d.banner, "\n"))
			}
			d.banner = append(d.banner, l)
			if m := regionLine.FindStringSubmatch(l); m != nil {
				region = m[1]
				d.grpc[region] = m[2]
			} else if m := globalLine.FindStringSubmatch(l); m != nil {
				d.global = m[1]
				region = ""
			} else if m := metricsLine.FindStringSubmatch(l); m != nil && region != "" {
				d.metrics[region] = "http://" + m[1] + "/metrics"
			} else if m != nil && d.global != "" && d.globalMetrics == "" {
				d.globalMetrics = "http://" + m[1] + "/metrics"
			}
			if strings.HasPrefix(l, "Ctrl-C stops everything") {
				t.Logf("dev mode up in %v:\n%s", time.Since(started).Round(time.Millisecond), strings.Join(d.banner, "\n"))
				return d
			}
		case <-ready:
			t.Fatalf("dev mode did not print its banner within 20s:\n%s", strings.Join(d.banner, "\n"))
		}
	}
}

// paste runs the banner's example containing marker with sh in dir.
func (d *devMode) paste(t *testing.T, dir, marker string) string {
	t.Helper()
	for _, l := range d.banner {
		if strings.Contains(l, marker) && !strings.Contains(l, "grpcurl") {
			cmd := exec.Command("sh", "-c", strings.TrimSpace(l))
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("example %q failed in %s: %v\n%s", strings.TrimSpace(l), dir, err, out)
			}
			return string(out)
		}
	}
	t.Fatalf("banner has no example with %q:\n%s", marker, strings.Join(d.banner, "\n"))
	return ""
}

// admitted is the sum over regions of the RLS answers OK, from each
// region's /metrics.
func (d *devMode) admitted(t *testing.T) float64 {
	t.Helper()
	var sum float64
	for region := range d.metrics {
		sum += d.counter(t, region, `sluice_envoy_request_duration_seconds_count{result="ok"}`)
	}
	return sum
}

// degraded is the sum over regions and series of the RLS decisions made
// by a class's on_failure policy, from each region's /metrics.
func (d *devMode) degraded(t *testing.T) float64 {
	t.Helper()
	var sum float64
	for region := range d.metrics {
		sum += d.sum(t, region, "sluice_envoy_degraded_decisions_total")
	}
	return sum
}

// epochReportsOf is how many epoch reports us-east's leader has sent.
func epochReportsOf(t *testing.T, d *devMode) float64 {
	t.Helper()
	return d.counter(t, "us-east", `sluice_regional_global_reports_total{kind="epoch"}`)
}

// counter is the value of series (name and labels, as /metrics prints
// them) on region's /metrics; 0 when absent.
func (d *devMode) counter(t *testing.T, region, series string) float64 {
	t.Helper()
	for _, l := range d.metricLines(t, region) {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(fmt.Errorf("%s: %q: %w", region, l, err))
			}
			return v
		}
	}
	return 0
}

// metricLines is region's /metrics, a line each.
func (d *devMode) metricLines(t *testing.T, region string) []string {
	t.Helper()
	return strings.Split(metrictest.Scrape(t, d.metrics[region]), "\n")
}

// sum is the sum of every series of the metric name on region's
// /metrics.
func (d *devMode) sum(t *testing.T, region, name string) float64 {
	t.Helper()
	var total float64
	for _, l := range d.metricLines(t, region) {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatal(fmt.Errorf("%s: %q: %w", region, l, err))
		}
		total += v
	}
	return total
}

// keyStatus is what the global allocator says of key in region (nil when
// it does not answer as leader or does not list the key).
func (d *devMode) keyStatus(t *testing.T, region string, key quota.Key) *sluicev1.KeyRegionStatus {
	t.Helper()
	if d.global == "" {
		t.Fatal("the banner names no global allocator address")
	}
	conn, err := grpc.NewClient(d.global, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	st, err := sluicev1.NewAllocatorServiceClient(conn).Status(context.Background(), &sluicev1.StatusRequest{TopKeys: 10})
	if err != nil || !st.GetLeader() {
		return nil
	}
	return st.KeyRegion(key.Tenant, key.Class, region)
}

// getBody is the body of a GET of url.
func getBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}
