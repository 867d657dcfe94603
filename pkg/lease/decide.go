package lease

import "time"

// The Client's defaults and the small rules Core applies (Core is the one
// place the Client and the simulator take their decisions from; a rule
// written anywhere else is a bug).
const (
	// DefaultRefresh is the period of the background Sync.
	DefaultRefresh = time.Second
	// DefaultBreakerTimeout bounds a synchronous Acquire or Check, and a
	// request's wait for a refill already in flight.
	DefaultBreakerTimeout = 50 * time.Millisecond
	// DefaultBreakerFailures consecutive failed RPCs open the breaker.
	DefaultBreakerFailures = 3
	// DefaultBreakerCooldown is how long the open breaker skips
	// synchronous RPCs before letting one probe through.
	DefaultBreakerCooldown = time.Second
	// MaxSyncAcquires is how many synchronous acquires a request makes at
	// most before it is decided from what is left (the batch it fetched
	// went to concurrent requests).
	MaxSyncAcquires = 2
	// MaxSlowRounds bounds a request's rounds on the slow path.
	MaxSlowRounds = 6
)

// GiveUp reports whether a request on the slow path that made acquires
// synchronous acquires in rounds rounds is decided now with
// Table.Exhausted.
func GiveUp(acquires, rounds int) bool {
	return acquires >= MaxSyncAcquires || rounds >= MaxSlowRounds
}

// RefillSpacing is how long the owner loop lets further early-refill
// kicks wait after one, so a burst of keys crossing their low-water marks
// shares one RPC.
func RefillSpacing(refresh time.Duration) time.Duration {
	return max(refresh/20, 5*time.Millisecond)
}

// CapHeldSpacing is the spacing that holds an early refill after one when
// a key crossed a cap-held mark (Core.RefillWait): a tenth of
// RefillSpacing, at least its 5 ms floor. It bounds how often one
// instance's early reports for keys holding their regions at the cap go
// out: at most 200 a second at the default refresh, each carrying every
// key due.
func CapHeldSpacing(refresh time.Duration) time.Duration {
	return max(refresh/200, 5*time.Millisecond)
}

// FallCheckEvery is how often the owner loop looks for keys whose demand
// fell (Core.PrepareFalls): a quarter refresh, so a fall is reported
// within a quarter refresh of becoming plain, and a key whose demand keeps
// falling costs at most four reports a refresh.
func FallCheckEvery(refresh time.Duration) time.Duration { return refresh / 4 }

// DefaultSyncTimeout bounds one background Sync or Release RPC unless
// configured.
func DefaultSyncTimeout(refresh time.Duration) time.Duration { return refresh / 2 }
