package envoyrls

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

// TestJudge pins what an answer of several descriptors says beyond its
// statuses: OVER_LIMIT when any is over limit, the longest retry delay of
// the over-limit ones, no time when any of them is a never denial, and
// the descriptor the headers describe: over limit first, then the fewest
// remaining, the first on ties, one in shadow mode only when every
// matched one is, and never an unlimited or unmatched one.
func TestJudge(t *testing.T) {
	lim := quota.Limit{Rate: 1, Burst: 10}
	type desc struct {
		class  string
		shadow bool
		kind   string // "", "unlimited" or "unmatched"
		result result
		remain uint32
		retry  time.Duration
		never  bool
	}
	cases := []struct {
		name      string
		descs     []desc
		over      bool
		retry     time.Duration
		never     bool
		shown     string // class of the descriptor shown, "" for none
		haveShown bool
	}{
		{"longest retry, shorter second", []desc{
			{class: "a", result: resultOverLimit, retry: 5 * time.Second},
			{class: "b", result: resultOverLimit, retry: 2 * time.Second},
		}, true, 5 * time.Second, false, "a", true},
		{"longest retry, longer second", []desc{
			{class: "a", result: resultOverLimit, retry: 2 * time.Second},
			{class: "b", result: resultOverLimit, retry: 5 * time.Second},
		}, true, 5 * time.Second, false, "a", true},
		{"a never denial first", []desc{
			{class: "a", result: resultOverLimit, never: true},
			{class: "b", result: resultOverLimit, retry: 3 * time.Second},
		}, true, 3 * time.Second, true, "a", true},
		{"a never denial last", []desc{
			{class: "a", result: resultOverLimit, retry: 3 * time.Second},
			{class: "b", result: resultOverLimit, never: true},
		}, true, 3 * time.Second, true, "a", true},
		{"over limit after allowed", []desc{
			{class: "a", result: resultOK, remain: 0},
			{class: "b", result: resultOverLimit, remain: 4, retry: time.Second},
		}, true, time.Second, false, "b", true},
		{"fewer remaining second", []desc{
			{class: "a", result: resultOK, remain: 5},
			{class: "b", result: resultOK, remain: 3},
		}, false, 0, false, "b", true},
		{"equal remaining: the first", []desc{
			{class: "a", result: resultOK, remain: 3},
			{class: "b", result: resultOK, remain: 3},
		}, false, 0, false, "a", true},
		{"shadow first, fewer remaining", []desc{
			{class: "a", shadow: true, result: resultShadowDenied, remain: 0},
			{class: "b", result: resultOK, remain: 5},
		}, false, 0, false, "b", true},
		{"shadow last, fewer remaining", []desc{
			{class: "a", result: resultOK, remain: 5},
			{class: "b", shadow: true, result: resultShadowDenied, remain: 0},
		}, false, 0, false, "a", true},
		{"every one in shadow mode", []desc{
			{class: "a", shadow: true, result: resultOK, remain: 5},
			{class: "b", shadow: true, result: resultShadowDenied, remain: 0},
		}, false, 0, false, "b", true},
		{"every one in shadow mode, the first closer", []desc{
			{class: "a", shadow: true, result: resultShadowDenied, remain: 0},
			{class: "b", shadow: true, result: resultOK, remain: 5},
		}, false, 0, false, "a", true},
		{"unlimited and unmatched are never shown", []desc{
			{class: "a", result: resultOK, remain: 7},
			{kind: "unlimited"},
			{kind: "unmatched"},
		}, false, 0, false, "a", true},
		{"nothing matched", []desc{{kind: "unlimited"}, {kind: "unmatched"}}, false, 0, false, "", false},
	}
	for _, c := range cases {
		targets := make([]Target, len(c.descs))
		decisions := make([]decided, len(c.descs))
		for i, d := range c.descs {
			switch d.kind {
			case "unlimited":
				targets[i] = Target{Unlimited: true}
				continue
			case "unmatched":
				continue
			}
			targets[i] = Target{Matched: true, Shadow: d.shadow, Resolved: config.Resolved{ClassName: d.class}}
			decisions[i] = decided{limit: lim, cap: 10, result: d.result, remaining: d.remain, retry: d.retry, reset: d.retry, never: d.never}
		}
		v := judge(targets, decisions)
		if over := v.out == outcomeOverLimit; over != c.over || v.retry != c.retry || v.never != c.never || v.haveShown != c.haveShown || v.shownClass != c.shown {
			t.Errorf("%s: over %v, retry %v, never %v, shown %q (%v); want %v, %v, %v, %q (%v)",
				c.name, over, v.retry, v.never, v.shownClass, v.haveShown, c.over, c.retry, c.never, c.shown, c.haveShown)
		}
	}
}
