package allocator

import "testing"

// TestNudgeHubHoldsOnePendingPerStream: a nudge wakes every stream of the
// regions named and no other, each stream holding at most one pending
// (a second nudge before it is read neither blocks nor queues); a
// cancelled stream is no longer counted or nudged, and a region whose
// last stream is cancelled is forgotten.
func TestNudgeHubHoldsOnePendingPerStream(t *testing.T) {
	var h nudgeHub
	a1, cancelA1 := h.subscribe("a")
	a2, cancelA2 := h.subscribe("a")
	b, cancelB := h.subscribe("b")
	defer cancelB()
	if n := h.watchers(); n != 3 {
		t.Fatalf("%d watchers, want 3", n)
	}
	h.nudge([]string{"a", "nowhere"})
	h.nudge([]string{"a"})
	for name, ch := range map[string]chan struct{}{"a1": a1, "a2": a2, "b": b} {
		want := 0
		if name != "b" {
			want = 1
		}
		if len(ch) != want {
			t.Errorf("stream %s holds %d nudges, want %d", name, len(ch), want)
		}
	}
	cancelA1()
	if n := h.watchers(); n != 2 {
		t.Fatalf("%d watchers after one of a's streams ended, want 2", n)
	}
	<-a2
	h.nudge([]string{"a"})
	if len(a2) != 1 {
		t.Fatalf("a's remaining stream holds %d nudges, want 1", len(a2))
	}
	cancelA2()
	h.mu.Lock()
	_, kept := h.subs["a"]
	h.mu.Unlock()
	if kept || h.watchers() != 1 {
		t.Fatalf("after a's last stream ended: a kept %v, %d watchers; want a forgotten, 1", kept, h.watchers())
	}
}
