package live

import (
	"fmt"
	"time"
)

// Whether the machine kept up with the scenario. Live mode stamps every
// arrival with the scenario time it was delivered at, not the time the
// traffic plan gave it: a driver that falls behind (the daemons, Redis and
// the driver needing more CPU than the machine has) delivers late, arrivals
// bunch up, and per-second measures swing for reasons that are the
// machine's. pace books how late each batch was delivered and how many
// requests an instance too far behind could not even queue, so the outcome
// says when its figures are the machine's rather than Sluice's.

// lateDelivery is how late, in scenario time, a delivery may be and still
// count as on time: a tenth of the one-second windows the utilization,
// ideal and false-reject measures are taken over.
const lateDelivery = 100 * time.Millisecond

// lateShare is the share of requests delivered late above which the
// outcome warns: a few late batches move single seconds by little; one in
// a hundred late means seconds whose ideal and offered load are not the
// plan's.
const lateShare = 0.01

// pace is the driver's delivery book. Not safe for concurrent use: only the
// driving goroutine writes it, and it is read after the drive ended.
type pace struct {
	requests int64         // delivered
	late     int64         // delivered more than lateDelivery after planned
	maxLate  time.Duration // scenario time
	shed     int64         // refused because their instance's queue was full
}

// delivered books n requests planned for scenario time planned and
// delivered at scenario time at.
func (p *pace) delivered(planned, at time.Duration, n int64) {
	p.requests += n
	late := at - planned
	if late > lateDelivery {
		p.late += n
	}
	p.maxLate = max(p.maxLate, late)
}

// refused books n requests an instance could not queue.
func (p *pace) refused(n int64) { p.shed += n }

// warnings says, in words an operator acts on, what makes the run's
// figures the machine's: none when the driver kept up.
func (p *pace) warnings() []string {
	var out []string
	if p.requests > 0 && float64(p.late) > lateShare*float64(p.requests) {
		out = append(out, fmt.Sprintf("the driver fell behind the traffic plan: %.1f%% of requests were delivered more than %v late (at most %v, scenario time), so per-second measures show the machine's delays; lower -scale or the scenario's size, or judge it in virtual mode",
			100*float64(p.late)/float64(p.requests), lateDelivery, p.maxLate.Round(time.Millisecond)))
	}
	if p.shed > 0 {
		out = append(out, fmt.Sprintf("%d requests were denied without a decision because their instance's queue was full (the instance fell behind on this machine; the quota had no say): they count as denied",
			p.shed))
	}
	return out
}
