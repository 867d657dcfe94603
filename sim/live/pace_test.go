package live

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sim/report"
	"github.com/sluicehq/sluice/sim/runner"
	"github.com/sluicehq/sluice/sim/scenarios"
)

// TestPaceWarnsOnlyPastItsBounds: a delivery exactly lateDelivery late is
// on time, and a late share of exactly lateShare is no warning; one
// request more of either, or one request shed, is.
func TestPaceWarnsOnlyPastItsBounds(t *testing.T) {
	var p pace
	p.delivered(time.Second, time.Second+lateDelivery, 1)       // on time, at the bound
	p.delivered(2*time.Second, 2*time.Second, 98)               // on time
	p.delivered(3*time.Second, 3*time.Second+lateDelivery+1, 1) // late: 1 of 100
	if w := p.warnings(); len(w) != 0 {
		t.Fatalf("1%% late warned: %q", w)
	}
	if p.maxLate != lateDelivery+1 {
		t.Errorf("max late %v, want %v", p.maxLate, lateDelivery+1)
	}
	p.delivered(4*time.Second, 4*time.Second+time.Second, 1) // 2 of 101
	w := p.warnings()
	if len(w) != 1 || !strings.Contains(w[0], "2.0% of requests were delivered more than 100ms late (at most 1s") {
		t.Fatalf("warnings %q, want the driver's lag", w)
	}

	var shed pace
	shed.delivered(time.Second, time.Second, 1000)
	shed.refused(3)
	if w := shed.warnings(); len(w) != 1 || !strings.HasPrefix(w[0], "3 requests were denied without a decision") {
		t.Fatalf("warnings %q, want the shed requests", w)
	}
	var none pace
	if w := none.warnings(); len(w) != 0 {
		t.Fatalf("a run that delivered nothing warned: %q", w)
	}
}

// TestLiveWarnsWhenTheDriverFallsBehind: a driver starved for a while
// (stalled once, as a machine short of CPU stalls it) delivers the rest of
// the run late; the outcome, its summary and its answer say the figures
// are the machine's.
func TestLiveWarnsWhenTheDriverFallsBehind(t *testing.T) {
	sc, err := scenarios.Load("steady")
	if err != nil {
		t.Fatal(err)
	}
	const scale = 8
	stallAt, stall := 32*time.Second, time.Second // scenario time (after the warmup), wall time
	stalled := false
	var log strings.Builder
	out, err := Run(context.Background(), sc, Options{Options: runner.Options{Duration: 40 * time.Second}, Scale: scale, Log: &log,
		beforeDelivery: func(planned time.Duration) {
			if !stalled && planned >= stallAt {
				stalled = true
				<-time.After(stall) // the fault: nothing delivered meanwhile
			}
		}})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if !stalled {
		t.Fatal("the driver never reached the stall")
	}
	var lag string
	for _, w := range out.Warnings {
		if strings.HasPrefix(w, "the driver fell behind the traffic plan") {
			lag = w
		}
	}
	if lag == "" {
		t.Fatalf("warnings %q name no lag\n%s", out.Warnings, log.String())
	}
	// The batch the driver stalled before came at least stall × scale late.
	m := regexp.MustCompile(`\(at most ([^,]+), scenario time\)`).FindStringSubmatch(lag)
	if m == nil {
		t.Fatalf("warning %q gives no worst delay", lag)
	}
	if worst, err := time.ParseDuration(m[1]); err != nil || worst < stall*scale {
		t.Errorf("worst delay %q (%v), want at least the stall's %v of scenario time", m[1], err, stall*scale)
	}
	sum := report.Summary(out)
	if !strings.Contains(sum, "WARNING: the driver fell behind") {
		t.Errorf("summary shows no warning:\n%s", sum)
	}
	if a := report.Answer(out); !strings.Contains(a, "the machine did not keep up") {
		t.Errorf("answer %q does not say the machine did not keep up", a)
	}
	if !strings.Contains(log.String(), "live: WARNING: the driver fell behind") {
		t.Errorf("log shows no warning:\n%s", log.String())
	}
}
