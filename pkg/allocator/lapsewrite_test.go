package allocator

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
)

// signalHandler is a slog.Handler that signals each record whose message
// starts with prefix.
type signalHandler struct {
	prefix string
	ch     chan struct{}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h signalHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h signalHandler) WithGroup(string) slog.Handler            { return h }
func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		select {
		case h.ch <- struct{}{}:
		default:
		}
	}
	return nil
}

// TestLapseNotCountedWhileItsWriteFails: a leader whose lapsed-set write
// etcd refuses (the election key it is fenced on is not its own) retries
// it and meanwhile counts the silent regions at their static share, as
// pending, and writes nothing.
func TestLapseNotCountedWhileItsWriteFails(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	s, err := newService(serviceOptions{config: StaticConfig{C: parseConfig(t, loopConfig+"region_lease: 1s\n")},
		advertise: "self:7500", logger: slog.New(slog.DiscardHandler)}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.promote(1, time.Now().Add(time.Hour), nil)
	s.mu.Lock()
	after := s.lapseAfterLocked()
	s.mu.Unlock()
	warned := make(chan struct{}, 1)
	e := &elector{cli: cli, svc: s, ttl: 5 * time.Second, lapsedKey: LapsedKey("/test"),
		log: slog.New(signalHandler{prefix: "lapsed set not written", ch: warned})}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.persistLapses(ctx, "/test/election/global/none", 1)
	}()
	defer func() {
		cancel()
		<-done
	}()
	// Until the second refused write (the first one's round is over),
	// nothing is counted lapsed.
	timeout := time.After(after + time.Minute) // the silence, then two rounds on a loaded machine
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for refused := 0; refused < 2; {
		select {
		case <-warned:
			refused++
		case <-poll.C:
		case <-timeout:
			t.Fatalf("%d refused writes of the lapsed set within %v of silence and a minute, want 2", refused, after)
		}
		if set := s.alloc.LapsedSet(); len(set) != 0 {
			t.Fatalf("regions %v counted lapsed after %d refused writes", set, refused)
		}
	}
	if plan := s.planLapses(time.Now()); !slices.Equal(plan.pending, []string{"a", "b"}) {
		t.Fatalf("planned %+v after the refused writes, want a and b pending", plan)
	}
	if resp, err := cli.Get(t.Context(), LapsedKey("/test")); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("the lapsed set key after refused writes: %v, %v; want none", resp, err)
	}
}
