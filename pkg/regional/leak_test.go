package regional_test

import (
	"flag"
	"runtime"
	"strconv"
	"testing"

	"go.uber.org/goleak"
)

// waitBoundParallel is how many of the package's parallel tests run side
// by side unless -parallel says otherwise. They are the ones that mostly
// wait on servers of their own (restarts, pauses, epochs, TTLs, a cluster
// forming) at 0.1-0.3 CPU s per wall s; go test's default of GOMAXPROCS
// (2 on a 2-core machine) left the cores idle while they waited.
const waitBoundParallel = 4

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if n := max(waitBoundParallel, runtime.GOMAXPROCS(0)); !given {
		if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
			panic(err)
		}
	}
	// go-redis retries a dial that failed (a Redis Cluster master killed
	// under a test) on a goroutine of its own, which sees its pool closed
	// and ends only after its one-second sleep: not a leak.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
