package allocator

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/cputime"
	"github.com/sluicehq/sluice/internal/envcount"
	"github.com/sluicehq/sluice/internal/reportcodec"
	"github.com/sluicehq/sluice/pkg/config"
)

// benchServiceConfig has five regions (us-east twice the weight of the
// others) and one class whose keys all run under the default tier.
const benchServiceConfig = `
epoch: 1s
grant_validity: 5s
regions:
  us-east: {weight: 2}
  us-west: {weight: 1}
  eu-west: {weight: 1}
  ap-south: {weight: 1}
  sa-east: {weight: 1}
classes:
  write: {}
tiers:
  free: {write: {rate: 1000/s, burst: 2000}}
default_tier: free
`

// BenchmarkServiceEpoch is the global daemon's side of one allocation
// epoch: the loop's step (Allocate) and one Sync per region, each a whole
// report of SLUICE_SERVICE_BENCH_KEYS keys (default 20,000) decoded from
// its message and answered with a message, every key contended (two hot
// regions per key, as pkg/hierarchy's BenchmarkAllocateEpoch), every
// report echoing the grants of the last answer. No gRPC transport: what
// the leader spends per report beyond it. It reports the thread CPU per
// epoch, as BenchmarkAllocateEpoch does. Sync reads the wall clock, so the
// epochs before the timed ones last the leader's learning (one validity,
// 5 s).
//
// Sub-benchmark message starts from the report as a message; wire also
// does what gRPC's codec does in the daemon around each Sync: the report
// unmarshalled from its bytes and the answer marshalled to bytes (the
// region's marshalling of the report is left out of the CPU reported).
func BenchmarkServiceEpoch(b *testing.B) {
	b.Run("message", func(b *testing.B) { benchServiceEpoch(b, false) })
	b.Run("wire", func(b *testing.B) { benchServiceEpoch(b, true) })
}

// benchServiceEpoch runs epochs of the service. With wire, each report is
// marshalled (by the region, left out of the CPU reported) and decoded,
// and each answer marshalled. The timed epochs alternate the decoder:
// the daemon's codec (reportcodec) in the first, third, … and
// proto.Unmarshal, gRPC's own, in the others, so the whole epoch under
// either compares in the same run, the allocator's work on what each
// decoded included: thread-cpu-ms, process-cpu-ms and decode-cpu-ms are
// the codec's epochs, the proto- ones proto's. B/op and allocs/op mix the
// two.
func benchServiceEpoch(b *testing.B, wire bool) {
	n := envcount.Get(b, "SLUICE_SERVICE_BENCH_KEYS", 20_000, 1)
	cfg, err := config.Parse([]byte(benchServiceConfig))
	if err != nil {
		b.Fatal(err)
	}
	s := quietService(b, StaticConfig{C: cfg})
	s.promote(1, time.Now().Add(time.Hour), nil)
	regions := []string{"us-east", "us-west", "eu-west", "ap-south", "sa-east"}
	reports := make([]*sluicev1.RegionReport, len(regions))
	slot := make(map[string]int, n) // tenant -> its key's index in the reports
	for r, name := range regions {
		rep := &sluicev1.RegionReport{Region: name, Keys: make([]*sluicev1.KeyDemand, n)}
		for k := range rep.Keys {
			demand := int64(100 + (k+r)%5*150)
			if (k+r)%5 >= 3 {
				demand = 900
			}
			tenant := fmt.Sprintf("tenant-%06d", k)
			slot[tenant] = k
			rep.Keys[k] = &sluicev1.KeyDemand{Key: &sluicev1.QuotaKey{Tenant: tenant, Class: "write"},
				Admitted: demand, WindowMs: 1000}
		}
		reports[r] = rep
	}
	// asideCPU is the thread CPU the region's marshalling took, left out
	// of the daemon's; decodeCPU the decoder's.
	var asideCPU, decodeCPU time.Duration
	useProto := false
	decode := func(raw []byte) *sluicev1.RegionReport {
		got := new(sluicev1.RegionReport)
		from := threadCPU(b)
		var err error
		if useProto {
			err = proto.Unmarshal(raw, got)
		} else {
			err = reportcodec.Unmarshal(raw, got)
		}
		if err != nil {
			b.Fatal(err)
		}
		decodeCPU += threadCPU(b) - from
		return got
	}
	serve := func(rep *sluicev1.RegionReport) *sluicev1.RegionGrants {
		if !wire {
			ans, err := s.Sync(b.Context(), rep)
			if err != nil {
				b.Fatal(err)
			}
			return ans
		}
		from := threadCPU(b)
		raw, err := proto.Marshal(rep)
		if err != nil {
			b.Fatal(err)
		}
		asideCPU += threadCPU(b) - from
		ans, err := s.Sync(b.Context(), decode(raw))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := proto.Marshal(ans); err != nil {
			b.Fatal(err)
		}
		return ans
	}
	epoch := func() int {
		s.step(time.Now())
		grants := 0
		for _, rep := range reports {
			rep.Seq++
			ans := serve(rep)
			grants += len(ans.GetGrants())
			for j, g := range ans.GetGrants() {
				// Grants come in report order when every reported key
				// gets one.
				kd := rep.Keys[min(j, len(rep.Keys)-1)]
				if kd.GetKey().GetTenant() != g.GetKey().GetTenant() {
					kd = rep.Keys[slot[g.GetKey().GetTenant()]]
				}
				kd.HeldRate, kd.HeldBurst, kd.HeldValidMs = g.GetRate(), g.GetBurst(), g.GetValidMs()
				kd.Holding = g.GetBurst() / 2
			}
		}
		return grants
	}
	// Past learning (one validity, on the wall clock) into steady state.
	learning := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.alloc.Learning(time.Now())
	}
	for learning() {
		epoch()
	}
	for range 3 {
		epoch()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	b.ResetTimer()
	// tally is the CPU of the timed epochs of one decoder: by[0] the
	// codec's (and every epoch of message), by[1] proto's.
	type tally struct {
		epochs                  int
		thread, process, decode time.Duration
	}
	var by [2]tally
	grants := 0
	for i := range b.N {
		k := 0
		if wire && i%2 == 1 {
			k = 1
		}
		useProto = k == 1
		aside, dec, thread, process := asideCPU, decodeCPU, threadCPU(b), processCPU(b)
		grants += epoch()
		// The process's CPU adds the collector's background work, which
		// runs on other threads: what allocating costs beyond the
		// allocation itself.
		aside = asideCPU - aside
		by[k].epochs++
		by[k].thread += threadCPU(b) - thread - aside
		by[k].process += processCPU(b) - process - aside
		by[k].decode += decodeCPU - dec
	}
	b.StopTimer()
	perEpoch := func(d time.Duration, epochs int) float64 {
		return float64(d.Microseconds()) / 1000 / float64(epochs)
	}
	b.ReportMetric(float64(grants)/float64(b.N), "grants/epoch")
	b.ReportMetric(perEpoch(by[0].thread, by[0].epochs), "thread-cpu-ms/epoch")
	b.ReportMetric(perEpoch(by[0].process, by[0].epochs), "process-cpu-ms/epoch")
	if wire {
		b.ReportMetric(perEpoch(by[0].decode, by[0].epochs), "decode-cpu-ms/epoch")
	}
	if by[1].epochs > 0 {
		b.ReportMetric(perEpoch(by[1].thread, by[1].epochs), "proto-thread-cpu-ms/epoch")
		b.ReportMetric(perEpoch(by[1].process, by[1].epochs), "proto-process-cpu-ms/epoch")
		b.ReportMetric(perEpoch(by[1].decode, by[1].epochs), "proto-decode-cpu-ms/epoch")
	}
}

// processCPU is the process's CPU time, every thread's.
func processCPU(b *testing.B) time.Duration {
	d, err := cputime.Process()
	if err != nil && !errors.Is(err, errors.ErrUnsupported) {
		b.Fatal(err)
	}
	return d
}

// threadCPU is the calling thread's CPU time (0 where the system does not
// account it per thread).
func threadCPU(b *testing.B) time.Duration {
	d, err := cputime.Thread()
	if err != nil && !errors.Is(err, errors.ErrUnsupported) {
		b.Fatal(err)
	}
	return d
}
