package lease

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's run when a goroutine outlives its tests.
// One is let go: go-redis's redial of a pool whose server was stopped (the
// test regions' Redis, in the degraded-mode tests) sleeps a second between
// attempts and ends at its next wake once its pool is closed; run alone,
// those tests end inside that second.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
