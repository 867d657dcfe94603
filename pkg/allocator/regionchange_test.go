package allocator

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/internal/configtest"
)

// TestRegionChangeReachesTheAllocator: a config change that keeps the
// epoch and validity but changes a region's weight, replaces a region by
// one of another name, or adds one, reaches the allocator's regions.
func TestRegionChangeReachesTheAllocator(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := configtest.NewSource(parseConfig(t, loopConfig), 1)
		s, err := newService(serviceOptions{config: src, advertise: "self:7500", logger: slog.New(slog.DiscardHandler)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		s.promote(1, time.Now().Add(time.Hour), nil)
		regions := func() string {
			s.step(time.Now())
			var out []string
			for _, r := range s.View(time.Now()).Regions {
				out = append(out, fmt.Sprintf("%s:%g", r.Name, r.Weight))
			}
			return strings.Join(out, " ")
		}
		if got := regions(); got != "a:1 b:1" {
			t.Fatalf("regions %s, want a:1 b:1", got)
		}
		src.Set(parseConfig(t, strings.Replace(loopConfig, "a: {weight: 1}", "a: {weight: 3}", 1)), 2)
		if got := regions(); got != "a:3 b:1" {
			t.Fatalf("after a's weight changed: regions %s, want a:3 b:1", got)
		}
		src.Set(parseConfig(t, strings.Replace(loopConfig, "b: {weight: 1}", "c: {weight: 1}", 1)), 3)
		if got := regions(); got != "a:1 c:1" {
			t.Fatalf("after b was replaced by c: regions %s, want a:1 c:1", got)
		}
		src.Set(parseConfig(t, strings.Replace(loopConfig, "b: {weight: 1}", "b: {weight: 1}\n  c: {weight: 1}", 1)), 4)
		if got := regions(); got != "a:1 b:1 c:1" {
			t.Fatalf("after b came back beside c: regions %s, want a:1 b:1 c:1", got)
		}
	})
}
