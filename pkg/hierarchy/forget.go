package hierarchy

import "time"

// ForgetHorizon is how long a key must go unnamed (no region reported it
// and no answer carried a grant for it) before the global tier may forget
// it (RemoveKey): 2·validity + 2·epoch. Every grant is valid for at most
// one validity from the answer that carried it; the rest is margin for an
// answer still in flight and a report that straddles an epoch, so no
// region can hold a grant for a key that is forgotten.
func ForgetHorizon(epoch, validity time.Duration) time.Duration {
	return 2*validity + 2*epoch
}

// Forgettable reports whether a key last named at lastSeen may be
// forgotten at now: unnamed for longer than ForgetHorizon, and not before
// learnFloor. The floor is set when the epoch, validity or demand alpha
// changes and the allocator is rebuilt (grants issued under the old
// validity may outlive the new horizon); it is the zero time when they
// never changed. The allocator service and the simulator's global tier
// both decide with this function.
func Forgettable(now, lastSeen, learnFloor time.Time, epoch, validity time.Duration) bool {
	return !now.Before(learnFloor) && now.Sub(lastSeen) > ForgetHorizon(epoch, validity)
}
