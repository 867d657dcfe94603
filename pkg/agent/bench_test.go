package agent_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/cputime"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/agent"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/regional"
)

// BenchmarkRLS compares, in one run and over loopback gRPC, three servers
// of Envoy's ShouldRateLimit, each in a process of its own (this test
// binary run again) so that its CPU time is its own:
//
//	agent      cmd/agent's endpoint: decisions from the agent's leases; its
//	           region (a regional service on a real redis-server) runs in
//	           the benchmark's process and is hardly ever called
//	regional   cmd/regional's endpoint: pkg/envoyrls deciding from the
//	           daemon's loopback lease client, on a real redis-server,
//	           behind the daemon's bounds (rpcguard), answering in wire
//	           form
//	stateless  a server that answers OK to everything without looking:
//	           the ceiling of the gRPC hop on this machine
//	agent-noheaders  the agent with -envoy-headers=false: its answers
//	           carry no x-ratelimit-*/ratelimit headers (what they cost)
//
// The key's limit is never reached, so every Sluice decision is an allow
// from held tokens. Each sub-benchmark reports req/s, the p50 and p99
// latency of one call, and the server's CPU time per request
// (getrusage(RUSAGE_SELF) of the server process around the run), and the
// callers' CPU time per request (this process's, which for the agent also
// holds its region's); the parent logs each Sluice endpoint's ratios to
// the stateless server, per round and their median.
//
// The callers share the machine's cores with the servers, so an answer
// that costs its caller more to read lowers every server's req/s alike:
// the rate-limit headers cost the callers a few µs a request to decode
// (agent against agent-noheaders), which the callers' CPU shows apart
// from the servers'.
//
//	go test -run '^$' -bench BenchmarkRLS -benchtime 20000x -v ./pkg/agent/
func BenchmarkRLS(b *testing.B) {
	cfg := regiontest.MustConfig(b, benchConfig)
	rs := redistest.Start(b)
	region := regiontest.StartOn(b, rs, cfg, "local")
	servers := map[string]*benchServer{
		"agent":     startBenchServer(b, "agent", region.Addr),
		"regional":  startBenchServer(b, "regional", rs.Addr()),
		"stateless": startBenchServer(b, "stateless", ""),
		// The agent without the rate-limit headers in its answers: what
		// the headers cost.
		"agent-noheaders": startBenchServer(b, "agent-noheaders", region.Addr),
	}
	req := envoyRequest("sluice", 0, "tenant", "acme", "class", "read")
	order := []string{"stateless", "agent", "regional", "agent-noheaders"}
	clients := map[string]rlsv3.RateLimitServiceClient{}
	for _, name := range order {
		conn, err := grpc.NewClient(servers[name].addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		clients[name] = rlsv3.NewRateLimitServiceClient(conn)
		// The first call connects and, for Sluice, takes the key's first
		// lease.
		resp, err := clients[name].ShouldRateLimit(context.Background(), req)
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			b.Fatalf("%s: first call: %v, %v", name, resp, err)
		}
	}
	// Rounds interleave the servers, so that a change in the load of a
	// shared machine falls on all of them; each round's ratios are
	// between runs a few seconds apart. Each round starts with the
	// stateless server and rotates the others: whichever runs right after
	// it measures a few percent slower, whatever it is, and rotating puts
	// each Sluice endpoint there in one round of three.
	var rounds []map[string]benchResult
	for round := range benchRounds {
		results := map[string]benchResult{}
		sluice := order[1:]
		k := round % len(sluice)
		for _, name := range slices.Concat(order[:1], sluice[k:], sluice[:k]) {
			client := clients[name]
			b.Run(name, func(b *testing.B) {
				results[name] = runRLS(b, servers[name], func(ctx context.Context) error {
					resp, err := client.ShouldRateLimit(ctx, req)
					if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						err = fmt.Errorf("answer %v; the key's limit is never reached", resp)
					}
					return err
				})
			})
		}
		rounds = append(rounds, results)
	}
	for _, name := range order[1:] {
		var rps, p99, cpu, callers []float64
		for i, results := range rounds {
			r, base := results[name], results["stateless"]
			if base.reqPerSec == 0 || r.reqPerSec == 0 {
				return // a sub-benchmark was filtered out or failed
			}
			rps = append(rps, r.reqPerSec/base.reqPerSec)
			p99 = append(p99, r.p99/base.p99)
			cpu = append(cpu, r.cpuPerReq/base.cpuPerReq)
			callers = append(callers, r.callerCPU/base.callerCPU)
			b.Logf("round %d %-8s vs stateless: req/s %.2f×  p99 %.2f×  server CPU/request %.2f× (%.1fµs vs %.1fµs)  callers' CPU/request %.2f×",
				i+1, name, rps[i], p99[i], cpu[i], r.cpuPerReq/1e3, base.cpuPerReq/1e3, callers[i])
		}
		b.Logf("median   %-8s vs stateless: req/s %.2f×  p99 %.2f×  server CPU/request %.2f×  callers' CPU/request %.2f×",
			name, median(rps), median(p99), median(cpu), median(callers))
	}
}

// benchRounds is how many times each server is measured, interleaved.
const benchRounds = 3

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

const benchConfig = `
regions: {local: {weight: 1}}
classes: {read: {mode: lease}}
tiers: {std: {read: {rate: 1000000000/s, burst: 1000000000}}}
default_tier: std
envoy: {descriptors: [{domain: sluice, tenant_key: tenant, class_key: class}]}
`

// benchParallelism × GOMAXPROCS concurrent callers, as in
// pkg/envoyrls's benchmarks.
const benchParallelism = 8

type benchResult struct {
	reqPerSec float64
	p99       float64 // ns
	cpuPerReq float64 // ns of server CPU
	callerCPU float64 // ns of the callers' CPU per request (this process)
}

func runRLS(b *testing.B, s *benchServer, call func(ctx context.Context) error) benchResult {
	var mu sync.Mutex
	var all []time.Duration
	ctx := context.Background()
	cpu0, own0 := s.cpu(b), ownCPU(b)
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		own := make([]time.Duration, 0, 4096)
		defer func() {
			mu.Lock()
			all = append(all, own...)
			mu.Unlock()
		}()
		for pb.Next() {
			t0 := time.Now()
			err := call(ctx)
			own = append(own, time.Since(t0))
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
	elapsed := time.Since(start)
	b.StopTimer()
	cpu, callers := s.cpu(b)-cpu0, ownCPU(b)-own0
	slices.Sort(all)
	at := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))].Nanoseconds()) }
	r := benchResult{
		reqPerSec: float64(b.N) / elapsed.Seconds(),
		p99:       at(0.99),
		cpuPerReq: float64(cpu.Nanoseconds()) / float64(b.N),
		callerCPU: float64(callers.Nanoseconds()) / float64(b.N),
	}
	b.ReportMetric(r.reqPerSec, "req/s")
	b.ReportMetric(at(0.50), "p50-ns")
	b.ReportMetric(r.p99, "p99-ns")
	b.ReportMetric(r.cpuPerReq, "server-cpu-ns/op")
	b.ReportMetric(r.callerCPU, "caller-cpu-ns/op")
	return r
}

// ---- the server processes ----

// benchServerEnv makes the test binary serve one kind of RLS server
// instead of running tests (see TestMain).
const (
	benchServerEnv = "SLUICE_AGENT_BENCH_SERVER"
	benchArgEnv    = "SLUICE_AGENT_BENCH_ARG"
)

// benchServer is a server process: it prints its address, answers "cpu"
// on stdin with its CPU time, and stops when stdin closes.
type benchServer struct {
	addr string
	in   io.WriteCloser
	out  *bufio.Reader
}

func startBenchServer(b *testing.B, kind, arg string) *benchServer {
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), benchServerEnv+"="+kind, benchArgEnv+"="+arg)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	s := &benchServer{in: in, out: bufio.NewReader(outPipe)}
	line, err := s.out.ReadString('\n')
	if err != nil {
		b.Fatalf("%s server: %v", kind, err)
	}
	s.addr = strings.TrimSpace(strings.TrimPrefix(line, "addr "))
	return s
}

func (s *benchServer) cpu(b *testing.B) time.Duration {
	if _, err := io.WriteString(s.in, "cpu\n"); err != nil {
		b.Fatal(err)
	}
	line, err := s.out.ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "cpu ")), 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(ns)
}

// ownCPU is this process's CPU time: the callers', and for the agent
// its region's, which it hardly ever calls.
func ownCPU(b *testing.B) time.Duration {
	d, err := cputime.Process()
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// serveBench is the server process's main: it returns the exit code.
func serveBench(kind, arg string) int {
	cfg, err := config.Parse([]byte(benchConfig))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	addr, stop, err := startKind(kind, arg, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, kind+":", err)
		return 1
	}
	defer stop()
	// SLUICE_AGENT_BENCH_CPUPROFILE=DIR writes each server's CPU profile
	// to DIR/<kind>.pprof.
	if dir := os.Getenv("SLUICE_AGENT_BENCH_CPUPROFILE"); dir != "" {
		f, err := os.Create(filepath.Join(dir, kind+".pprof"))
		if err == nil && pprof.StartCPUProfile(f) == nil {
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}
	// SLUICE_AGENT_BENCH_MEMPROFILE=DIR writes each server's heap profile
	// (live objects after a collection, and every allocation) to
	// DIR/<kind>.heap.pprof when it stops, and logs its collections.
	if dir := os.Getenv("SLUICE_AGENT_BENCH_MEMPROFILE"); dir != "" {
		defer func() {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			fmt.Fprintf(os.Stderr, "%s: %d collections, %d MB allocated, %.1f MB live heap\n",
				kind, ms.NumGC, ms.TotalAlloc>>20, float64(ms.HeapAlloc)/(1<<20))
			if f, err := os.Create(filepath.Join(dir, kind+".heap.pprof")); err == nil {
				pprof.WriteHeapProfile(f)
				f.Close()
			}
		}()
	}
	fmt.Printf("addr %s\n", addr)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "cpu" {
			d, err := cputime.Process()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Printf("cpu %d\n", d.Nanoseconds())
		}
	}
	return 0
}

// startKind starts one server as its daemon would run it (metrics
// registered, headers on) and returns its gRPC address.
func startKind(kind, arg string, cfg *config.Config) (string, func(), error) {
	quiet := slog.New(slog.DiscardHandler)
	switch kind {
	case "agent", "agent-noheaders":
		headers := kind == "agent"
		a, err := agent.Start(agent.Options{
			RegionAddr: arg, Config: agent.StaticConfig{C: cfg}, EnvoyHeaders: &headers,
			GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", Logger: quiet,
		})
		if err != nil {
			return "", nil, err
		}
		return a.GRPCAddr(), a.Stop, nil
	case "regional":
		reg := prometheus.NewRegistry()
		svc, err := envoyrls.New(envoyrls.Options{Config: regional.StaticConfig{C: cfg}, Registerer: reg, Logger: quiet})
		if err != nil {
			return "", nil, err
		}
		d, err := regional.StartDaemon(context.Background(), regional.DaemonOptions{
			Region: "local", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", RedisAddr: arg,
			Config: regional.StaticConfig{C: cfg}, ColdStart: regional.ColdStartFull, Unleased: true,
			Registry: reg, Logger: quiet, Envoy: svc, // as cmd/regional serves it
		})
		if err != nil {
			return "", nil, err
		}
		loop, err := envoyrls.DialLoopback(d.GRPCAddr(), nil, lease.Options{
			InstanceID: lease.UniqueID("envoy"), Logger: quiet, Registerer: reg,
		})
		if err != nil {
			d.Stop()
			return "", nil, err
		}
		svc.SetLimiter(loop)
		return d.GRPCAddr(), func() { loop.Close(context.Background()); d.Stop() }, nil
	case "stateless":
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		g := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(g, alwaysOK{})
		go g.Serve(lis)
		return lis.Addr().String(), g.Stop, nil
	}
	return "", nil, fmt.Errorf("unknown server kind %q", kind)
}

// alwaysOK answers OK to every request, one status per descriptor,
// without looking at it.
type alwaysOK struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (alwaysOK) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return resp, nil
}
