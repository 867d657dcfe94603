package scenario

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRegionDownFailoverAndEventsParse(t *testing.T) {
	s, err := Parse([]byte(minimal + `faults:
  - {at: 30s, kind: region-down, region: a, restart_after: 20s, redis_lost: true}
failovers:
  - {at: 30s, from: a, to: [b], for: 40s}
events:
  - {at: 40s, kind: drain, region: a}
  - {at: 80s, kind: restore, region: a}
expect: {recovery: 10s, recovered_vs_ideal_min: 0.97, recovered_false_rejects_max: 0.01}
`))
	if err != nil {
		t.Fatal(err)
	}
	if f := s.Faults[0]; f.Kind != FaultRegionDown || !f.RedisLost || time.Duration(f.RestartAfter) != 20*time.Second {
		t.Fatalf("fault %+v", f)
	}
	if len(s.Failovers) != 1 || s.Failovers[0].To[0] != "b" || len(s.Events) != 2 {
		t.Fatalf("failovers %+v events %+v", s.Failovers, s.Events)
	}
	short, err := s.WithDuration(35 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(short.Events) != 0 || len(short.Failovers) != 1 {
		t.Fatalf("shortened run keeps events %v failovers %v", short.Events, short.Failovers)
	}
}

func TestBadRegionDownFailoverAndEventsAreRefused(t *testing.T) {
	for _, c := range []struct{ name, doc, want string }{
		{"region-down without region", "faults: [{at: 10s, kind: region-down}]\n", "faults[0].region"},
		{"redis_lost without restart", "faults: [{at: 10s, kind: region-down, region: a, redis_lost: true}]\n", "faults[0].redis_lost"},
		{"redis_lost on another kind", "faults: [{at: 10s, kind: partition, region: a, for: 5s, redis_lost: true}]\n", "faults[0].redis_lost"},
		{"failover to itself", "failovers: [{at: 10s, from: a, to: [a]}]\n", "failovers[0].to[0]"},
		{"failover nowhere", "failovers: [{at: 10s, from: a}]\n", "failovers[0].to"},
		{"failover from unknown", "failovers: [{at: 10s, from: x, to: [b]}]\n", "failovers[0].from"},
		{"failover after the end", "failovers: [{at: 3m, from: a, to: [b]}]\n", "failovers[0].at"},
		{"failover listed twice", "failovers: [{at: 1s, from: a, to: [b, b]}]\n", "failovers[0].to[1]"},
		{"unknown event", "events: [{at: 10s, kind: explode, region: a}]\n", "events[0].kind"},
		{"event in unknown region", "events: [{at: 10s, kind: drain, region: x}]\n", "events[0].region"},
		{"every region drained", "events: [{at: 10s, kind: drain, region: a}, {at: 5s, kind: drain, region: b}]\n", "events[0]"},
		{"recovered target without recovery", "expect: {recovered_vs_ideal_min: 0.9}\n", "expect.recovery"},
		{"recovered target out of range", "expect: {recovery: 5s, recovered_false_rejects_max: 2}\n", "expect.recovered_false_rejects_max"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := Parse([]byte(minimal + c.doc))
			if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v (scenario %v), want an error naming %s", err, s != nil, c.want)
			}
		})
	}
	// Draining one region after restoring the other is fine.
	if _, err := Parse([]byte(minimal + "events: [{at: 10s, kind: drain, region: a}, {at: 20s, kind: restore, region: a}, {at: 30s, kind: drain, region: b}]\n")); err != nil {
		t.Fatal(err)
	}
}
