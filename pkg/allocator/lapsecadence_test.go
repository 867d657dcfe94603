package allocator

import (
	"context"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/internal/logtest"
)

// TestLapseWriteIsTriedEveryHalfEpoch: while a lapse is pending and its
// write fails (here on a closed etcd client, each try given 1 ms), the
// leader tries it again half an epoch after the last try ended, no less
// and no more often.
func TestLapseWriteIsTriedEveryHalfEpoch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := quietService(t, StaticConfig{C: parseConfig(t, loopConfig+"region_lease: 2s\n")})
		s.promote(1, time.Now().Add(time.Hour), nil)
		s.mu.Lock()
		after := s.lapseAfterLocked()
		s.mu.Unlock()
		// Neither region reports: both are pending a lapse from here on.
		time.Sleep(after + time.Millisecond)
		if plan := s.planLapses(time.Now()); !plan.write {
			t.Fatalf("regions silent for %v: planned %+v, want a write", after, plan)
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		if err := cli.Close(); err != nil {
			t.Fatal(err)
		}
		logs := &logtest.Buffer{}
		e := &elector{cli: cli, ttl: time.Millisecond, svc: s, log: slog.New(slog.NewTextHandler(logs, nil)), lapsedKey: LapsedKey("")}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.persistLapses(ctx, "election/key", 1)
		}()
		const epochs = 10
		time.Sleep(epochs*100*time.Millisecond + 25*time.Millisecond) // loopConfig's epoch is 100ms
		cancel()
		<-done
		if n := logs.Count("lapsed set not written"); n != 2*epochs {
			t.Fatalf("%d failed writes in %d epochs, want %d (one every half epoch and 1 ms):\n%s", n, epochs, 2*epochs, logs)
		}
		if st := s.alloc.LapsedSet(); len(st) != 0 {
			t.Fatalf("lapsed %v counted although no write succeeded", st)
		}
	})
}
