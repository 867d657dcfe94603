package lease

import (
	"testing"
	"time"
)

func TestBreaker(t *testing.T) {
	b := NewBreaker(3, time.Second)
	now := t0
	for i := 0; i < 2; i++ {
		b.Failure(now)
		if !b.Allow(now) || b.Open() {
			t.Fatalf("open after %d failures, threshold 3", i+1)
		}
	}
	b.Success()
	b.Failure(now)
	b.Failure(now)
	if b.Open() {
		t.Fatal("success did not reset the consecutive count")
	}
	b.Failure(now)
	if !b.Open() || b.Allow(now) || b.Ready(now.Add(999*time.Millisecond)) {
		t.Fatal("not open after 3 consecutive failures")
	}

	// Half-open: one probe at a time.
	probeAt := now.Add(time.Second)
	if !b.Ready(probeAt) || !b.Allow(probeAt) {
		t.Fatal("no probe after the cooldown")
	}
	if b.Ready(probeAt) || b.Allow(probeAt) {
		t.Fatal("second probe while one is in flight")
	}
	b.Failure(probeAt)
	if b.Allow(probeAt.Add(999*time.Millisecond)) || !b.Allow(probeAt.Add(time.Second)) {
		t.Fatal("failed probe did not reopen for one cooldown")
	}
	b.Abandon()
	if !b.Allow(probeAt.Add(time.Second)) {
		t.Fatal("abandoned probe kept its slot")
	}
	b.Success()
	if b.Open() || !b.Allow(probeAt) {
		t.Fatal("successful probe did not close the breaker")
	}
}

// TestBreakerTimeoutFollowsSlowAnswers: the wait before a failure is the
// breaker timeout while the region answers fast, follows the region's
// recent round trips (4 × their median) when they are slow, never beyond
// the limit, and is lengthened neither by calls that got no answer nor by
// a few answers delayed by an outage.
func TestBreakerTimeoutFollowsSlowAnswers(t *testing.T) {
	const base, limit = 50 * time.Millisecond, 500 * time.Millisecond
	b := NewBreaker(3, time.Second)
	if got := b.Timeout(base, limit); got != base {
		t.Fatalf("no answer seen yet: timeout %v, want %v", got, base)
	}
	at := t0
	rtt := func(d time.Duration) {
		b.ObserveRTT(at, at.Add(d))
		at = at.Add(time.Second)
	}
	for range 20 {
		rtt(time.Millisecond)
	}
	if got := b.Timeout(base, limit); got != base {
		t.Fatalf("fast answers: timeout %v, want %v", got, base)
	}
	b.Failure(t0)
	b.Failure(t0)
	if got := b.Timeout(base, limit); got != base {
		t.Fatalf("failures changed the timeout to %v", got)
	}
	// A few answers that waited out an outage do not lengthen the wait.
	for range 3 {
		rtt(2 * time.Second)
	}
	if got := b.Timeout(base, limit); got != base {
		t.Fatalf("three answers delayed by an outage changed the timeout to %v", got)
	}
	for range 20 {
		rtt(120 * time.Millisecond)
	}
	if got := b.Timeout(base, limit); got <= 120*time.Millisecond || got > limit {
		t.Fatalf("answers in 120ms: timeout %v, want above 120ms and at most %v", got, limit)
	}
	for range 20 {
		rtt(10 * time.Second)
	}
	if got := b.Timeout(base, limit); got != limit {
		t.Fatalf("answers in 10s: timeout %v, want the limit %v", got, limit)
	}
	// A configured timeout above the limit is kept as it is, and slow
	// answers do not lengthen it: the limit leaves no room to grow.
	if got := NewBreaker(3, time.Second).Timeout(time.Second, limit); got != time.Second {
		t.Fatalf("base above the limit: %v", got)
	}
	if got := b.Timeout(time.Second, limit); got != time.Second {
		t.Fatalf("base above the limit, answers in 10s: timeout %v, want the base %v", got, time.Second)
	}
	if got := b.Timeout(limit, limit); got != limit {
		t.Fatalf("base equal to the limit, answers in 10s: timeout %v, want %v", got, limit)
	}
}

// TestBreakerTimeoutIsFourTimesTheMedian: after slow answers the wait is
// exactly four times the median of the last 16 answered round trips,
// from the first answer on; the median is the upper one, so a region that
// turned slow is followed once 8 of the 16 were slow, not at 7; answers in
// no time (same instant) are fast answers too.
func TestBreakerTimeoutIsFourTimesTheMedian(t *testing.T) {
	const base, limit = 50 * time.Millisecond, 10 * time.Second
	const slow = 100 * time.Millisecond
	at := t0
	rtt := func(b *Breaker, d time.Duration) {
		b.ObserveRTT(at, at.Add(d))
		at = at.Add(time.Second)
	}
	b := NewBreaker(3, time.Second)
	rtt(b, slow)
	if got := b.Timeout(base, limit); got != 4*slow {
		t.Fatalf("one answer in %v: timeout %v, want %v", slow, got, 4*slow)
	}

	b = NewBreaker(3, time.Second)
	for range rttSamples {
		rtt(b, time.Millisecond)
	}
	for i := 1; i <= rttSamples/2; i++ {
		rtt(b, slow)
		want := base
		if i == rttSamples/2 {
			want = 4 * slow
		}
		if got := b.Timeout(base, limit); got != want {
			t.Fatalf("%d of the last %d answers in %v: timeout %v, want %v", i, rttSamples, slow, got, want)
		}
	}

	b = NewBreaker(3, time.Second)
	for range rttSamples/2 + 1 {
		rtt(b, 0)
	}
	for range rttSamples/2 - 1 {
		rtt(b, slow)
	}
	if got := b.Timeout(base, limit); got != base {
		t.Fatalf("9 answers in no time, 7 in %v: timeout %v, want %v", slow, got, base)
	}
}

// TestBreakerThresholdBelowOneCountsAsOne: a breaker configured with a
// threshold below 1 opens at the first failure.
func TestBreakerThresholdBelowOneCountsAsOne(t *testing.T) {
	for _, threshold := range []int{0, -2} {
		b := NewBreaker(threshold, time.Second)
		b.Failure(t0)
		if !b.Open() || b.Allow(t0) {
			t.Fatalf("threshold %d: not open after one failure", threshold)
		}
	}
}

// TestBreakerFailuresWhileOpenKeepItsCooldown: failures reported while the
// breaker is open and no probe is out (background Syncs keep failing) do
// not push the probe back: it goes out one cooldown after the opening.
func TestBreakerFailuresWhileOpenKeepItsCooldown(t *testing.T) {
	b := NewBreaker(3, time.Second)
	for range 3 {
		b.Failure(t0)
	}
	b.Failure(t0.Add(500 * time.Millisecond))
	if !b.Ready(t0.Add(time.Second)) || !b.Allow(t0.Add(time.Second)) {
		t.Fatal("a failure during the cooldown delayed the probe")
	}
}

// TestBreakerCountsOnlyFailuresNoLaterCallContradicts: a call that got no
// answer counts toward opening only when no call sent after it has
// been answered; a region that answered a later call is reachable (the
// failed call waited behind a burst, or went to a hung replica of
// several). Calls sent after the last answer count as before, and a
// half-open probe that fails reopens whatever was answered.
func TestBreakerCountsOnlyFailuresNoLaterCallContradicts(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	b := NewBreaker(3, time.Second)
	// Calls sent at 0, 1 and 2ms; one sent at 3ms is answered.
	b.ObserveRTT(ms(3), ms(30))
	b.Success()
	for _, sent := range []int{0, 1, 2} {
		if b.FailureOf(ms(sent), ms(50+sent)) {
			t.Fatalf("the failure of a call sent at %dms counted; a call sent after it was answered", sent)
		}
	}
	if b.Open() {
		t.Fatal("opened on calls sent before one the region answered")
	}
	// Calls sent with the last answered one or after it are evidence:
	// three open it.
	for i, sent := range []int{3, 4, 5} {
		if b.Open() {
			t.Fatalf("open after %d failures, threshold 3", i)
		}
		if !b.FailureOf(ms(sent), ms(60+sent)) {
			t.Fatalf("the failure of a call sent at %dms did not count; no call sent after it was answered", sent)
		}
	}
	if !b.Open() {
		t.Fatal("not open after 3 calls sent after the last answer failed")
	}
	// A failed probe reopens even though an earlier-sent call's answer
	// arrives meanwhile (its send time is before the probe's).
	probe := ms(1100)
	if !b.Allow(probe) {
		t.Fatal("no probe after the cooldown")
	}
	b.ObserveRTT(ms(1000), ms(1120))
	b.FailureOf(probe, ms(1150))
	if b.Allow(ms(1151)) {
		t.Fatal("a failed probe did not reopen the breaker")
	}
	// Before any answer, failures count.
	fresh := NewBreaker(1, time.Second)
	fresh.FailureOf(ms(0), ms(50))
	if !fresh.Open() {
		t.Fatal("a failure with no answer ever seen did not count")
	}
}

// TestBreakerProbeFailureCountsWhateverWasAnswered: the failure of a
// half-open probe counts and reopens the breaker even when a call sent
// after the probe was answered before its Success was recorded: only a
// probe's verdict may close or reopen the half-open breaker.
func TestBreakerProbeFailureCountsWhateverWasAnswered(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	b := NewBreaker(1, time.Second)
	if !b.FailureOf(ms(0), ms(50)) || !b.Open() {
		t.Fatal("a failure with no answer ever seen did not open a breaker of threshold 1")
	}
	probe := ms(1100)
	if !b.Allow(probe) {
		t.Fatal("no probe after the cooldown")
	}
	b.ObserveRTT(ms(1110), ms(1120)) // sent after the probe
	if !b.FailureOf(probe, ms(1150)) {
		t.Fatal("a failed probe's failure did not count: a call sent after it was answered")
	}
	if !b.Open() || b.Allow(ms(2149)) {
		t.Fatal("a failed probe did not reopen the breaker for its cooldown")
	}
	if !b.Allow(ms(2150)) {
		t.Fatal("no probe after the new cooldown")
	}
}

// TestBreakerAnOlderCallAnsweredLastKeepsTheLatestSent: the calls a
// failure is weighed against are those sent after it, whatever the order
// their answers came in: an older call answered last does not make the
// failure of a call sent between the two count.
func TestBreakerAnOlderCallAnsweredLastKeepsTheLatestSent(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	b := NewBreaker(1, time.Second)
	b.ObserveRTT(ms(3), ms(10))
	b.Success()
	b.ObserveRTT(ms(1), ms(20)) // sent before, answered after
	b.Success()
	if b.FailureOf(ms(2), ms(40)) || b.Open() {
		t.Fatal("the failure of a call sent at 2ms counted; one sent at 3ms was answered")
	}
}

// TestBreakerTimeoutReadsAllSixteenSamples: the median is of the last 16
// answered round trips, the ring's every slot included: however many
// fast answers came first, the wait follows the region on its 8th slow
// answer, not its 7th nor its 9th.
func TestBreakerTimeoutReadsAllSixteenSamples(t *testing.T) {
	const base, limit = 50 * time.Millisecond, 10 * time.Second
	const slow = 100 * time.Millisecond
	for fast := rttSamples / 2; fast <= 2*rttSamples; fast++ {
		b := NewBreaker(3, time.Second)
		at := t0
		rtt := func(d time.Duration) {
			b.ObserveRTT(at, at.Add(d))
			at = at.Add(time.Second)
		}
		for range fast {
			rtt(time.Millisecond)
		}
		for i := 1; i <= rttSamples/2; i++ {
			rtt(slow)
			want := base
			if i == rttSamples/2 {
				want = 4 * slow
			}
			if got := b.Timeout(base, limit); got != want {
				t.Fatalf("%d fast answers, then %d in %v: timeout %v, want %v", fast, i, slow, got, want)
			}
		}
	}
}

// TestBreakerClosedByAProbeProbesAgainWhenItReopens: a probe that
// succeeded frees the probe slot with the breaker it closes, so when the
// breaker opens again a probe goes out one cooldown later (it is not held
// for the first probe forever), and failures after the close are weighed
// as a closed breaker's: a call a later answer contradicts does not count.
func TestBreakerClosedByAProbeProbesAgainWhenItReopens(t *testing.T) {
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	b := NewBreaker(1, time.Second)
	b.Failure(ms(0))
	if !b.Allow(ms(1000)) {
		t.Fatal("no probe after the cooldown")
	}
	b.ObserveRTT(ms(1000), ms(1010))
	b.Success()
	if b.Open() {
		t.Fatal("a successful probe did not close the breaker")
	}
	if b.FailureOf(ms(999), ms(1100)) || b.Open() {
		t.Fatal("closed again, the failure of a call sent before the probe's answered one counted")
	}
	b.Failure(ms(1200))
	if !b.Open() || b.Allow(ms(2199)) {
		t.Fatal("a failure after the close did not reopen the breaker for a cooldown")
	}
	if !b.Ready(ms(2200)) || !b.Allow(ms(2200)) {
		t.Fatal("no probe one cooldown after the breaker reopened: the first probe's slot was kept")
	}
}
