package world

import (
	"testing"
	"time"
)

// TestDrainAndRestoreGoThroughTheChains: a drained region runs on its
// floor as soon as it adopts the revision; restored, its static share
// rises only once the global tier confirmed a revision every region
// reported; the other region's share never moves.
func TestDrainAndRestoreGoThroughTheChains(t *testing.T) {
	h := build(t, "events: [{at: 30s, kind: drain, region: b}, {at: 60s, kind: restore, region: b}]\n")
	h.start()
	h.w.scheduleEvents()
	k := h.w.keys[0]
	a, b := h.w.regions[0], h.w.regions[1]
	static := k.common[b.idx].StaticRate
	if static < 49.99 || k.common[a.idx].StaticRate != static {
		t.Fatalf("static shares %v, %v before the drain, want about 50 each", k.common[a.idx].StaticRate, static)
	}
	h.until(29 * time.Second)
	if k.common[b.idx].StaticRate != static {
		t.Fatal("b's share moved before the drain")
	}
	h.until(31 * time.Second)
	if got := k.common[b.idx].StaticRate; got != 0 || h.w.configs.regions[b.idx].rev != 1 {
		t.Fatalf("b drained: static share %v (revision %d), want its floor 0", got, h.w.configs.regions[b.idx].rev)
	}
	h.until(60*time.Second + 200*time.Millisecond)
	rc := h.w.configs.regions[b.idx]
	if rc.rev != 2 || k.common[b.idx].StaticRate != 0 {
		t.Fatalf("b restored at revision %d: share %v at once, want still 0 until confirmed", rc.rev, k.common[b.idx].StaticRate)
	}
	if k.common[b.idx].AwaitingShare || b.common(k).AwaitingShare {
		t.Fatal("b's share of 0 before the restore is confirmed counts as awaited: it is the drained floor, a key must climb from it")
	}
	h.until(70 * time.Second)
	if got := k.common[b.idx].StaticRate; got != static || h.w.configs.regions[b.idx].chain.Confirmed() != 2 {
		t.Fatalf("b's share %v after the restore was confirmed (confirmed %d), want %v", got,
			h.w.configs.regions[b.idx].chain.Confirmed(), static)
	}
	if k.common[a.idx].StaticRate != static {
		t.Fatal("a's static share moved")
	}
	h.until(2 * time.Minute)
	if r := h.orc.Finish(2 * time.Minute); !r.Pass() {
		t.Fatalf("invariants broken around a drain and restore: %s", r)
	}
}
