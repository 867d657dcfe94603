package hierarchy

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/sluicehq/sluice/internal/rapidfuzz"
)

// FuzzTimeline searches TestTimelineNeverOversubscribes' property (regions
// that report, fall silent, lapse and come back, limits and weights that
// change, answers lost and delayed: never more granted than the limit) with
// the fuzzer choosing every draw.
func FuzzTimeline(f *testing.F) {
	rapidfuzz.AddSeeds(f, 32, 1<<16)
	f.Fuzz(rapid.MakeFuzz(timeline))
}

// FuzzReshardTimeline does the same for TestReshardingNeverOversubscribes
// (a key's shard changing while its grants are out).
func FuzzReshardTimeline(f *testing.F) {
	rapidfuzz.AddSeeds(f, 32, 1<<16)
	f.Fuzz(rapid.MakeFuzz(reshardTimeline))
}
