package lease

import (
	"slices"
	"sync"
	"time"
)

// Breaker is a consecutive-failure circuit breaker on explicit time. Closed,
// every call goes through; after Threshold consecutive failures it opens for
// Cooldown, during which synchronous calls are skipped (the caller applies
// the key's on_failure policy at once instead of waiting for a timeout).
// When the cooldown has passed, one call at a time is let through as a
// probe: success closes the breaker, failure opens it for another cooldown.
// Any success (a background Sync too) closes it.
//
// A failure must be evidence, not a hiccup: an error, or no answer within
// the call's timeout. A request waits Timeout for its call, which is the
// configured breaker timeout or, when the region's recent answers were
// slow (a healthy region on a loaded machine), four times their median,
// whichever is longer; the call itself goes on for four Timeouts
// (Core.AcquireCallTimeout), and only then, unanswered, is a failure: an
// answer in between lands and is a sample (Slow.AcquireGaveUp). A slow but healthy region
// therefore neither opens the breaker nor sends requests to their
// on_failure policy, while a region that stops answering after answering
// fast is given up on within the configured timeout. And a call that
// failed counts toward opening only when no call sent after it has been
// answered (FailureOf): a region that answered a later call is
// reachable, and the failed one was queued behind a burst (a thousand
// first requests at once on a loaded machine) or went to one replica of
// several that hangs; opening then sent every key to its policy while the
// region answered (93% of 10,000 first requests from 16 callers, and all
// calls while one replica of two was paused).
//
// Safe for concurrent use.
type Breaker struct {
	threshold int
	cooldown  time.Duration

	mu        sync.Mutex
	failures  int                       // guarded by mu: consecutive failures
	open      bool                      // guarded by mu
	openUntil time.Time                 // guarded by mu
	probing   bool                      // guarded by mu: a half-open probe is in flight
	rtts      [rttSamples]time.Duration // guarded by mu: the last answered round trips, a ring
	nrtt      int                       // guarded by mu: answered round trips seen
	// lastSent is the send time of the latest-sent call answered (zero:
	// none yet). Guarded by mu.
	lastSent time.Time
	// answeredAt is when the latest answer came (zero: none yet). Guarded
	// by mu.
	answeredAt time.Time
}

// rttSamples is how many recent answered round trips Timeout looks at.
const rttSamples = 16

// ObserveRTT records the round trip of a call sent at sent and answered at
// now. Calls that got no answer are not samples: a region that stops
// answering must not lengthen the wait for it.
func (b *Breaker) ObserveRTT(sent, now time.Time) {
	rtt := now.Sub(sent)
	if rtt < 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rtts[b.nrtt%rttSamples] = rtt
	b.nrtt++
	if sent.After(b.lastSent) {
		b.lastSent = sent
	}
	if now.After(b.answeredAt) {
		b.answeredAt = now
	}
}

// AnsweredAfter reports whether the service answered a call (ObserveRTT)
// after t, whenever that call was sent.
func (b *Breaker) AnsweredAfter(t time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.answeredAt.After(t)
}

// Timeout is how long a synchronous call waits for the region before the
// caller gives up on it (a failure) and its on_failure policy decides:
// base, or four times the median of the last 16 answered round trips when
// that is longer, never more than limit; a base at or above limit is the
// wait whatever the answers (it is never cut, and has no room to grow). The median
// follows a region that became slow within 8 answers, and ignores the few
// answers that waited out an outage's backlog when it ended (they say
// nothing of the region's speed; a mean would keep the wait long for the
// next outage).
func (b *Breaker) Timeout(base, limit time.Duration) time.Duration {
	b.mu.Lock()
	n := min(b.nrtt, rttSamples)
	var buf [rttSamples]time.Duration
	copy(buf[:], b.rtts[:n])
	b.mu.Unlock()
	t := base
	if n > 0 {
		xs := buf[:n]
		slices.Sort(xs)
		t = max(base, 4*xs[n/2])
	}
	return min(t, max(base, limit))
}

// NewBreaker returns a closed breaker. threshold < 1 counts as 1.
func NewBreaker(threshold int, cooldown time.Duration) *Breaker {
	if threshold < 1 {
		threshold = 1
	}
	return &Breaker{threshold: threshold, cooldown: cooldown}
}

// Ready reports whether a call could go through at now, without claiming
// the half-open probe.
func (b *Breaker) Ready(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return !b.open || (!b.probing && !now.Before(b.openUntil))
}

// Allow reports whether a call may go through at now. When the breaker is
// half-open it claims the single probe slot; the caller must then report
// Success, Failure or Abandon.
func (b *Breaker) Allow(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open {
		return true
	}
	if b.probing || now.Before(b.openUntil) {
		return false
	}
	b.probing = true
	return true
}

// Success records a call that reached the service; it closes the breaker.
func (b *Breaker) Success() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	b.open = false
	b.probing = false
}

// Failure records a call that could not reach the service at now.
func (b *Breaker) Failure(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failureLocked(now)
}

func (b *Breaker) failureLocked(now time.Time) {
	b.failures++
	switch {
	case b.probing:
		b.probing = false
		b.openUntil = now.Add(b.cooldown)
	case !b.open && b.failures >= b.threshold:
		b.open = true
		b.openUntil = now.Add(b.cooldown)
	}
}

// FailureOf records a call sent at sent that could not reach the service
// by now, as Failure does, unless a call sent after it has been answered
// (ObserveRTT): then the service is reachable and this call is
// no evidence against it, and only a half-open probe's failure reopens.
// It reports whether the failure counted: false means the service was
// answering, so what the call was for must not be decided as for a
// service that cannot be reached.
func (b *Breaker) FailureOf(sent, now time.Time) (counted bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.probing && b.answeredSinceLocked(sent) {
		return false
	}
	b.failureLocked(now)
	return true
}

// AnsweredSince reports whether a call sent after sent has been answered
// (ObserveRTT), as FailureOf weighs a failure, without recording one.
func (b *Breaker) AnsweredSince(sent time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.answeredSinceLocked(sent)
}

// answeredSinceLocked is AnsweredSince; the caller holds b.mu.
func (b *Breaker) answeredSinceLocked(sent time.Time) bool { return b.lastSent.After(sent) }

// Abandon releases a probe that ended without a verdict (the caller gave
// up), so the next call may probe.
func (b *Breaker) Abandon() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = false
}

// Open reports whether the breaker is open (half-open counts as open).
func (b *Breaker) Open() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}
