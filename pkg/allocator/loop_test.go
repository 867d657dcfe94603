package allocator

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/metrictest"
	"github.com/sluicehq/sluice/pkg/config"
)

const loopConfig = `
epoch: 100ms
grant_validity: 500ms
regions:
  a: {weight: 1}
  b: {weight: 1}
classes:
  write: {}
tiers:
  free: {write: {rate: 100/s, burst: 100}}
default_tier: free
`

func parseConfig(t *testing.T, yaml string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("parse config: %v", err)
	}
	return c
}

// quietService is a Service on src, created now, that logs nothing and
// runs no loop: the test steps, promotes and syncs it by hand.
func quietService(t testing.TB, src ConfigSource) *Service {
	t.Helper()
	s, err := newService(serviceOptions{config: src, advertise: "self:7500", logger: slog.New(slog.DiscardHandler)}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// loggedService is quietService with its log kept in the returned buffer,
// for tests of what the service logs.
func loggedService(t *testing.T, src ConfigSource) (*Service, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	s, err := newService(serviceOptions{config: src, advertise: "self:7500", logger: slog.New(slog.NewTextHandler(logs, nil))}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s, logs
}

// memConfig is an in-memory ConfigSource that publishes like
// configstore.Watcher, for code that must run without etcd (a synctest bubble).
type memConfig struct {
	mu   sync.Mutex
	cfg  *config.Config
	subs []chan *config.Config
}

func (m *memConfig) Current() *config.Config {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cfg
}

func (m *memConfig) Subscribe() (<-chan *config.Config, func()) {
	ch := make(chan *config.Config, 1)
	m.mu.Lock()
	m.subs = append(m.subs, ch)
	m.mu.Unlock()
	return ch, func() {
		m.mu.Lock()
		m.subs = slices.DeleteFunc(m.subs, func(c chan *config.Config) bool { return c == ch })
		m.mu.Unlock()
	}
}

func (m *memConfig) set(c *config.Config) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cfg = c
	for _, ch := range m.subs {
		select {
		case <-ch:
		default:
		}
		ch <- c
	}
}

func writeReport(region string, seq uint64) *sluicev1.RegionReport {
	return &sluicev1.RegionReport{Region: region, Seq: seq, Keys: []*sluicev1.KeyDemand{{
		Key: &sluicev1.QuotaKey{Tenant: "acme", Class: "write"}, Admitted: 100, WindowMs: 100,
	}}}
}

func regionNames(s *Service) []string {
	var names []string
	for _, r := range s.View(time.Now()).Regions {
		names = append(names, r.Name)
	}
	return names
}

// TestAllocationLoop runs the loop in virtual time: it allocates once per
// epoch only while leading, stops at the leadership deadline, applies a
// published config at once, follows an epoch change, and keeps learning
// until grants of the old, longer validity have expired.
func TestAllocationLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &memConfig{cfg: parseConfig(t, loopConfig)}
		s := quietService(t, src)
		reg := prometheus.NewRegistry()
		newMetrics(reg, s)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { s.run(ctx); close(done) }()
		const epoch = 100 * time.Millisecond

		// Not elected: epochs pass, nothing is allocated, Sync is refused
		// with the known leader.
		s.observeLeader("other:7500")
		time.Sleep(3*epoch + epoch/2)
		synctest.Wait()
		if n := s.View(time.Now()).Epoch; n != 0 {
			t.Fatalf("a replica that does not lead ran %d epochs", n)
		}
		_, err := s.Sync(ctx, writeReport("a", 1))
		if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition || st.Message() != "not leader; leader=other:7500" {
			t.Fatalf("follower Sync: %v", err)
		}
		if g := metrictest.Gauge(t, reg, "sluice_global_leader"); g != 0 {
			t.Fatalf("leader gauge %v on a follower", g)
		}

		// Elected until start+1s: one allocation per epoch, learning for
		// one validity (500ms).
		start := time.Now()
		if !s.promote(1, start.Add(time.Second), nil) {
			t.Fatal("promote refused with a future deadline")
		}
		if g := metrictest.Gauge(t, reg, "sluice_global_learning"); g != 1 {
			t.Fatalf("learning gauge %v right after winning", g)
		}
		resp, err := s.Sync(ctx, writeReport("a", 1))
		if err != nil || !resp.Learning {
			t.Fatalf("leader Sync in learning mode: %v %v", resp, err)
		}
		// Promoted half way between ticks: three epochs hold three ticks.
		time.Sleep(3 * epoch)
		synctest.Wait()
		if n := s.View(time.Now()).Epoch; n != 3 {
			t.Fatalf("%d epochs in 3 epochs of leading, want 3", n)
		}
		time.Sleep(start.Add(500 * time.Millisecond).Sub(time.Now()))
		if g := metrictest.Gauge(t, reg, "sluice_global_learning"); g != 0 {
			t.Fatalf("learning gauge %v after one validity", g)
		}
		if g := metrictest.Gauge(t, reg, "sluice_global_leader"); g != 1 {
			t.Fatalf("leader gauge %v while leading", g)
		}

		// A keepalive of another term does not extend this one; at the
		// deadline the replica stops granting and allocating by itself.
		s.extend(2, start.Add(time.Hour))
		time.Sleep(start.Add(time.Second - time.Millisecond).Sub(time.Now()))
		if _, err := s.Sync(ctx, writeReport("a", 2)); err != nil {
			t.Fatalf("Sync just before the deadline: %v", err)
		}
		time.Sleep(time.Millisecond)
		_, err = s.Sync(ctx, writeReport("a", 3))
		if st, _ := status.FromError(err); st.Code() != codes.FailedPrecondition {
			t.Fatalf("Sync at the deadline: %v, want FailedPrecondition", err)
		}
		if !strings.HasSuffix(err.Error(), "leader=other:7500") {
			t.Fatalf("redirect lost: %v", err)
		}
		epochs := s.View(time.Now()).Epoch
		time.Sleep(5 * epoch)
		synctest.Wait()
		if n := s.View(time.Now()).Epoch; n != epochs {
			t.Fatalf("allocated %d epochs after the deadline", n-epochs)
		}

		// A published config applies at once, without waiting for a tick.
		s.promote(3, time.Now().Add(time.Hour), nil)
		time.Sleep(epoch / 2)
		src.set(parseConfig(t, strings.Replace(loopConfig, "b: {weight: 1}", "b: {weight: 1}\n  c: {weight: 2}", 1)))
		synctest.Wait()
		if got := regionNames(s); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Fatalf("regions after reload %v, want [a b c]", got)
		}
		if _, err := s.Sync(ctx, writeReport("c", 1)); err != nil {
			t.Fatalf("Sync from the added region: %v", err)
		}

		// A longer epoch and validity: the allocator is rebuilt and the
		// loop ticks every 200ms.
		slow := strings.Replace(loopConfig, "epoch: 100ms\ngrant_validity: 500ms", "epoch: 200ms\ngrant_validity: 1s", 1)
		src.set(parseConfig(t, slow))
		synctest.Wait()
		time.Sleep(time.Second + epoch/2)
		synctest.Wait()
		if n := s.View(time.Now()).Epoch; n != 5 {
			t.Fatalf("%d epochs of 200ms in 1.05s, want 5", n)
		}

		// Back to a 400ms validity: grants issued under the 1s validity
		// may live 1s more (plus one old epoch), so learning lasts until
		// then, not just 400ms.
		changed := time.Now()
		fast := strings.Replace(loopConfig, "grant_validity: 500ms", "grant_validity: 400ms", 1)
		src.set(parseConfig(t, fast))
		synctest.Wait()
		time.Sleep(changed.Add(1150 * time.Millisecond).Sub(time.Now()))
		synctest.Wait()
		if !s.View(time.Now()).Learning {
			t.Fatal("learning ended before grants of the old validity expired")
		}
		time.Sleep(changed.Add(1250 * time.Millisecond).Sub(time.Now()))
		synctest.Wait()
		if s.View(time.Now()).Learning {
			t.Fatal("still learning after the old validity and one new validity")
		}

		cancel()
		<-done
	})
}
