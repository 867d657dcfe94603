package scale

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sluicehq/sluice/sim/report"
)

// Result is what a run measured. Everything but the wall times is a
// function of the spec and seed.
type Result struct {
	Spec     *Spec
	Duration time.Duration
	// Tracked keys are modeled (peak demand at or above trackAt of a
	// static share somewhere); ContendedKeys of them exceed a share.
	Tracked, ContendedKeys int
	// TrackedAll and ContendedAll are the same over the whole key space
	// (Tracked is a sample of TrackedAll when the spec samples).
	TrackedAll, ContendedAll int
	// Modeled is how many (key, region) buckets the Model held.
	Modeled int
	// Scale is the demand calibration (tokens/s per unit of raw demand).
	Scale   float64
	Regions []RegionResult
	Shards  []ShardResult
	Links   []LinkResult
	Oracle  OracleResult
	Notes   []string
	Events  uint64
	// Wall times (not deterministic).
	SetupWall, Wall time.Duration
}

// RegionResult is one region's totals over the run.
type RegionResult struct {
	Name string
	// Reports are report messages sent to the shards (one per shard per
	// report), Answers those answered, Failed those with no shard leader.
	Reports, Answers, Failed int64
	BytesUp, BytesDown       float64
	// ControlCalls is the region leader's Redis commands per second
	// (TIME and static lease, candidate sets, key states, set_rate,
	// static lease stores).
	ControlCalls float64

	dataCalls, offered float64 // totals
	reportedSum        float64 // keys in epoch reports
	reportedMax        float64
	reports            int64 // epoch reports
	contendedSum       float64
	contendedMax       float64
	epochs             int64
}

// ShardResult is one global shard's totals.
type ShardResult struct {
	Shard                     int
	Reports                   int64
	KeysIn, BytesIn, BytesOut float64
	Grants                    float64
	ContendedMax              float64
	ContendedMean             float64
	// ContendedSamples is how many times Contended* were sampled (every
	// 30 epochs); 0 in a run too short for one, whose contended reads n/a.
	ContendedSamples    int64
	AllocMean, AllocMax time.Duration // wall, per Allocate
}

// LinkResult is one (region, shard) pair's traffic.
type LinkResult struct {
	Region                   string
	Shard                    int
	Reports, Answers, Failed int64
	Keys, BytesUp, BytesDown float64
}

// OracleResult is the oracle's verdict.
type OracleResult struct {
	// SumChecks instants of Σ rates ≤ r and Σ caps ≤ b (every epoch for
	// every key some region was granted, and after every applied grant).
	SumChecks                     int64
	RateViolations, CapViolations int64
	MaxRateRatio, MaxCapRatio     float64
	FirstRate, FirstCap           string
	ConformViolations             int64
	MaxExcess                     float64
	FirstConform                  string
	// Admitted and Ideal: contended keys after warmup, the fleet and an
	// ideal central bucket fed the same demand.
	Admitted, Ideal float64
}

// Holds says whether every invariant held.
func (o OracleResult) Holds() bool {
	return o.RateViolations == 0 && o.CapViolations == 0 && o.ConformViolations == 0
}

// Utilization is admitted over ideal on contended keys.
func (o OracleResult) Utilization() float64 {
	if o.Ideal == 0 {
		return 1
	}
	return o.Admitted / o.Ideal
}

func newResult(s *Spec, d time.Duration) *Result {
	r := &Result{Spec: s, Duration: d, Regions: make([]RegionResult, s.Regions)}
	for g := range r.Regions {
		r.Regions[g].Name = regionName(g)
	}
	return r
}

func (r *Result) note(at time.Duration, s string) {
	r.Notes = append(r.Notes, fmt.Sprintf("%8v  %s", at, s))
}

// DataCalls is region g's data-plane Redis commands per second.
func (r *Result) DataCalls(g int) float64 { return r.Regions[g].dataCalls / r.Duration.Seconds() }

// Summary renders the result for people.
func (r *Result) Summary() string {
	var b strings.Builder
	s := r.Spec
	secs := r.Duration.Seconds()
	fmt.Fprintf(&b, "Sluice scale simulation: %s, seed %d\n", s.Name, s.Seed)
	for _, l := range report.Wrap(s.Description, 76) {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	fmt.Fprintf(&b, "  %v simulated (day %v, warmup %v) · %d keys · %d contended (%.2f%%) · %d near a share · %d regions · %d instances · %d shards\n",
		r.Duration, time.Duration(s.Day), time.Duration(s.Warmup), s.Keys, r.ContendedAll,
		100*float64(r.ContendedAll)/float64(s.Keys), r.TrackedAll, s.Regions, s.Instances, s.Shards)
	if s.Sample > 1 {
		fmt.Fprintf(&b, "  modeled: 1 in %d of the keys near a share (%d keys, %d contended); their per-key costs scaled by %d\n",
			s.Sample, r.Tracked, r.ContendedKeys, s.Sample)
	}
	fmt.Fprintf(&b, "  %d (key, region) buckets modeled in the scripts' twin; the rest counted analytically\n\n", r.Modeled)
	o := r.Oracle
	fmt.Fprintf(&b, "  Oracle                                 Result Value\n")
	fmt.Fprintf(&b, "  Σ regional rates <= r, every epoch     %-6s %d violations in %d checks; max Σ/limit %.6f\n", pass(o.RateViolations == 0), o.RateViolations, o.SumChecks, o.MaxRateRatio)
	fmt.Fprintf(&b, "  Σ regional caps <= b, every epoch      %-6s %d violations in %d checks; max Σ/limit %.6f\n", pass(o.CapViolations == 0), o.CapViolations, o.SumChecks, o.MaxCapRatio)
	fmt.Fprintf(&b, "  admitted <= b + r·t per key (fluid)    %-6s %d violations; max excess %.3f tokens\n", pass(o.ConformViolations == 0), o.ConformViolations, o.MaxExcess)
	fmt.Fprintf(&b, "  utilization, contended keys            %-6s %.2f%% of an ideal central bucket\n", "", 100*o.Utilization())
	for _, f := range []string{o.FirstRate, o.FirstCap, o.FirstConform} {
		if f != "" {
			fmt.Fprintf(&b, "    first: %s\n", f)
		}
	}
	fmt.Fprintf(&b, "\n  Per region (per second of simulated time)\n")
	fmt.Fprintf(&b, "  %-10s %10s %10s %9s %11s %11s %12s %10s %10s %12s\n", "region", "offered/s", "reports/s", "answers/s", "up B/s", "down B/s", "data cmd/s", "ctl cmd/s", "keys/rep", "contended")
	for g, rg := range r.Regions {
		keys, cont := 0.0, 0.0
		if rg.reports > 0 {
			keys = rg.reportedSum / float64(rg.reports)
		}
		if rg.epochs > 0 {
			cont = rg.contendedSum / float64(rg.epochs)
		}
		fmt.Fprintf(&b, "  %-10s %10.0f %10.2f %9.2f %11.0f %11.0f %12.0f %10.1f %10s %12s\n", rg.Name, rg.offered/secs,
			float64(rg.Reports)/secs, float64(rg.Answers)/secs, rg.BytesUp/secs, rg.BytesDown/secs,
			r.DataCalls(g), rg.ControlCalls, fmt.Sprintf("%.0f/%.0f", keys, rg.reportedMax), fmt.Sprintf("%.0f/%.0f", cont, rg.contendedMax))
	}
	fmt.Fprintf(&b, "  (keys/rep: keys in an epoch report, mean/max; contended: keys above their static share there, mean/max)\n")
	fmt.Fprintf(&b, "\n  Per global shard\n")
	fmt.Fprintf(&b, "  %-6s %10s %10s %11s %11s %10s %12s\n", "shard", "reports/s", "keys/s", "in B/s", "out B/s", "grants/s", "contended")
	for _, sh := range r.Shards {
		cont := "n/a"
		if sh.ContendedSamples > 0 {
			cont = fmt.Sprintf("%.0f/%.0f", sh.ContendedMean, sh.ContendedMax)
		}
		fmt.Fprintf(&b, "  %-6d %10.2f %10.0f %11.0f %11.0f %10.0f %12s\n", sh.Shard, float64(sh.Reports)/secs, sh.KeysIn/secs,
			sh.BytesIn/secs, sh.BytesOut/secs, sh.Grants/secs, cont)
	}
	fmt.Fprintf(&b, "  (contended: keys the shard's allocator finds contended, sampled every 30 epochs, mean/max; n/a before the first sample)\n")
	if len(r.Notes) > 0 {
		fmt.Fprintf(&b, "\n  Events\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "  %s\n", n)
		}
	}
	fmt.Fprintf(&b, "\n  Result: %s\n", map[bool]string{true: "PASS", false: "FAIL"}[o.Holds()])
	return b.String()
}

// WallSummary is the run's wall times (not deterministic).
func (r *Result) WallSummary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "wall: %v (setup %v), %d events\n", r.Wall.Round(time.Millisecond), r.SetupWall.Round(time.Millisecond), r.Events)
	for _, sh := range r.Shards {
		fmt.Fprintf(&b, "shard %d: Allocate mean %v, max %v\n", sh.Shard, sh.AllocMean.Round(time.Microsecond), sh.AllocMax.Round(time.Microsecond))
	}
	return b.String()
}

func pass(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// WriteCSV writes one row per region and per (region, shard) link and per
// shard: the summary's numbers per second of simulated time.
func (r *Result) WriteCSV(w io.Writer) error {
	secs := r.Duration.Seconds()
	var b strings.Builder
	b.WriteString("kind,region,shard,offered_per_s,reports_per_s,answers_per_s,failed_per_s,bytes_up_per_s,bytes_down_per_s,keys_per_s,data_cmds_per_s,control_cmds_per_s,grants_per_s\n")
	for g, rg := range r.Regions {
		fmt.Fprintf(&b, "region,%s,,%.3f,%.4f,%.4f,%.4f,%.1f,%.1f,%.1f,%.1f,%.2f,\n", rg.Name, rg.offered/secs, float64(rg.Reports)/secs,
			float64(rg.Answers)/secs, float64(rg.Failed)/secs, rg.BytesUp/secs, rg.BytesDown/secs,
			rg.reportedSum/secs, r.DataCalls(g), rg.ControlCalls)
	}
	for _, l := range r.Links {
		fmt.Fprintf(&b, "link,%s,%d,,%.4f,%.4f,%.4f,%.1f,%.1f,%.1f,,,\n", l.Region, l.Shard, float64(l.Reports)/secs, float64(l.Answers)/secs,
			float64(l.Failed)/secs, l.BytesUp/secs, l.BytesDown/secs, l.Keys/secs)
	}
	for _, sh := range r.Shards {
		fmt.Fprintf(&b, "shard,,%d,,%.4f,%.4f,,%.1f,%.1f,%.1f,,,%.1f\n", sh.Shard, float64(sh.Reports)/secs, float64(sh.Reports)/secs,
			sh.BytesIn/secs, sh.BytesOut/secs, sh.KeysIn/secs, sh.Grants/secs)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
