package regional

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/configtest"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/regionsync"
)

// TestRetryBackoffWaitsDoublingUpToItsBound: the late reads of a region's
// history come one epoch after the start, then after waits doubling up to
// resumeRetryMaxEpochs epochs, follow an epoch changed meanwhile, stop
// once an attempt says it is done, and stop at once when the daemon's
// context ends, leaving no goroutine behind (synctest.Test fails on one).
func TestRetryBackoffWaitsDoublingUpToItsBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		epoch := time.Second
		start := time.Now()
		var at []time.Duration
		retryBackoff(t.Context(), func() time.Duration { return epoch }, resumeRetryMaxEpochs, func(context.Context) bool {
			at = append(at, time.Since(start))
			return len(at) < 7
		})
		want := []time.Duration{1, 3, 7, 15, 31, 47, 63}
		for i := range want {
			want[i] *= time.Second
		}
		if !slices.Equal(at, want) {
			t.Errorf("attempts at %v, want %v", at, want)
		}

		// The epoch is read before each wait.
		at, start = nil, time.Now()
		retryBackoff(t.Context(), func() time.Duration { return epoch }, resumeRetryMaxEpochs, func(context.Context) bool {
			at = append(at, time.Since(start))
			epoch = 2 * time.Second
			return len(at) < 2
		})
		if want := []time.Duration{time.Second, 5 * time.Second}; !slices.Equal(at, want) {
			t.Errorf("with the epoch doubled after the first attempt: attempts at %v, want %v", at, want)
		}

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		attempts := 0
		go func() {
			defer close(done)
			retryBackoff(ctx, func() time.Duration { return time.Second }, resumeRetryMaxEpochs, func(context.Context) bool {
				attempts++
				return true
			})
		}()
		time.Sleep(4 * time.Second) // the bubble's clock: attempts at 1 and 3 s
		synctest.Wait()
		cancel()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("retryBackoff still waits after its context ended")
		}
		if attempts != 2 {
			t.Errorf("%d attempts in 4 s, want 2", attempts)
		}
	})
}

// TestStartedUnconfirmedEndsWithAConfirmation: a process that started on
// revision 20 without reading its region's history (its source reads no
// earlier revision: not read again) runs unconfirmed
// (sluice_regional_chain_unconfirmed) until the region confirms 20, or a
// later revision its chain holds, or a late read finds 20 stored as
// confirmed; a confirmation of an older revision, or a config adopted,
// does not end it, and a late read once the chain moved on changes
// nothing.
func TestStartedUnconfirmedEndsWithAConfirmation(t *testing.T) {
	parse := func(eu int) *config.Config { return euWeighted(t, "", eu) }
	rdb := redistest.Start(t).Client()
	ctx := t.Context()
	for _, end := range []string{"confirmed itself", "a later one confirmed", "stored as confirmed"} {
		t.Run(end, func(t *testing.T) {
			if err := rdb.Set(ctx, "sl:confirmed", "10", 0).Err(); err != nil {
				t.Fatal(err)
			}
			src := configtest.NewSource(parse(3), 20)
			s, err := New(Options{Region: "eu", Redis: rdb, Config: src, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			// What sluice_regional_chain_unconfirmed exports.
			unconfirmed := func() int64 { return s.unconfirmedRev.Load() }
			if err := s.ResumeChain(ctx); err == nil || ResumeChainRetryable(err) {
				t.Fatalf("ResumeChain with a source that reads no history: %v, want an error not read again", err)
			}
			if got := unconfirmed(); got != 20 {
				t.Fatalf("unconfirmed %v after the start, want 20", got)
			}
			s.confirm(10)
			if got := unconfirmed(); got != 20 {
				t.Fatalf("unconfirmed %v after the older revision 10 confirmed, want 20", got)
			}
			switch end {
			case "confirmed itself":
				s.confirm(20)
			case "a later one confirmed":
				src.Set(parse(2), 30)
				s.staticChain()
				if got := unconfirmed(); got != 20 {
					t.Fatalf("unconfirmed %v after 30 adopted, want 20", got)
				}
				if retry, err := s.resumeChain(ctx, true); retry || err != nil || s.chain.Load().Len() != 2 {
					t.Fatalf("a late read once the chain moved on: %v, %v, chain of %d; want nothing done", retry, err, s.chain.Load().Len())
				}
				s.confirm(30)
			case "stored as confirmed":
				if err := rdb.Set(ctx, "sl:confirmed", "20", 0).Err(); err != nil {
					t.Fatal(err)
				}
				if retry, err := s.resumeChain(ctx, true); retry || err != nil {
					t.Fatalf("a late read with 20 stored as confirmed: %v, %v; want done", retry, err)
				}
			}
			if got := unconfirmed(); got != 0 {
				t.Fatalf("unconfirmed %v once %s, want 0", got, end)
			}
		})
	}
}

// TestEtcdUnansweredTellsOutagesFromAnswers: a history read that failed
// because etcd did not answer (a deadline, no leader, a server out of
// reach, as etcd's client reports them, wrapped or not) is read again; one
// etcd answered (a compacted revision, a revision that wrote no config, a
// config that does not validate) is not.
func TestEtcdUnansweredTellsOutagesFromAnswers(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{fmt.Errorf("reading: %w", context.DeadlineExceeded), true},
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), true},
		{status.Error(codes.Unavailable, "connection refused"), true},
		{rpctypes.ErrNoLeader, true},
		{fmt.Errorf("the configs committed after revision 3: %w", rpctypes.ErrTimeout), true},
		{fmt.Errorf("config: %w: revision 3 is compacted", configstore.ErrHistoryGone), false},
		{rpctypes.ErrCompacted, false},
		{errors.New("config: revision 3 did not write /sluice/config"), false},
		{status.Error(codes.InvalidArgument, "bad"), false},
	} {
		if got := etcdUnanswered(tc.err); got != tc.want {
			t.Errorf("etcdUnanswered(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// partialHistory is a config source whose history read gives read and err.
type partialHistory struct {
	*configtest.Source
	read []configstore.Committed
	err  error
}

func (p partialHistory) History(context.Context, int64, int64, int) ([]configstore.Committed, error) {
	return p.read, p.err
}

// TestPartialHistoryReadStartsBoundedByWhatItRead: a start that read the
// config last confirmed to its region but not all those committed since
// runs bounded by those it read, warns that the others were not read, and
// returns why; a full read warns of nothing.
func TestPartialHistoryReadStartsBoundedByWhatItRead(t *testing.T) {
	parse := func(eu int) *config.Config { return euWeighted(t, "", eu) }
	rdb := redistest.Start(t).Client()
	ctx := t.Context()
	if err := rdb.Set(ctx, "sl:confirmed", "10", 0).Err(); err != nil {
		t.Fatal(err)
	}
	const warning = "could not all be read"
	for _, partial := range []bool{true, false} {
		t.Run(fmt.Sprintf("partial=%v", partial), func(t *testing.T) {
			src := partialHistory{Source: configtest.NewSource(parse(3), 30), read: []configstore.Committed{{Rev: 10, Cfg: parse(1)}}}
			if partial {
				src.err = errors.New("etcd: the configs after revision 10 not read")
			}
			logs := &logtest.Buffer{}
			s, err := New(Options{Region: "eu", Redis: rdb, Config: src, Logger: slog.New(slog.NewTextHandler(logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			err = s.ResumeChain(ctx)
			if partial && (err == nil || ResumeChainRetryable(err)) || !partial && err != nil {
				t.Fatalf("ResumeChain: %v", err)
			}
			if n := s.chain.Load().Len(); n != 2 {
				t.Fatalf("a chain of %d configs, want the one read and the one started on", n)
			}
			if got := logs.Count(warning); got != map[bool]int{true: 1, false: 0}[partial] {
				t.Errorf("%q logged %d times\n%s", warning, got, logs)
			}
		})
	}
}

// TestLateReadsOfTheHistoryWaitAnEpochThenDouble: a process whose Redis
// refused its connection at the start reads its region's history again
// one epoch later, then after two: not at once, and not in a loop.
func TestLateReadsOfTheHistoryWaitAnEpochThenDouble(t *testing.T) {
	rdb := refusingRedis(t)
	cfg := euWeighted(t, "epoch: 200ms", 3)
	epoch := time.Duration(cfg.Epoch)
	logs := &logtest.Buffer{}
	s, err := New(Options{Region: "eu", Redis: rdb, Config: configtest.NewSource(cfg, 20),
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.ResumeChain(t.Context()); !ResumeChainRetryable(err) {
		t.Fatalf("ResumeChain with Redis refusing connections: %v, want an error read again", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); s.resumeLate(ctx) }()
	defer func() { cancel(); <-done }()
	const again = "reading it again later"
	for deadline := start.Add(100 * epoch); logs.Count(again) < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 2 late reads within %v\n%s", 100*epoch, logs)
		}
		time.Sleep(epoch / 10) // polling the late reads with a deadline
	}
	var at []time.Time
	for line := range strings.Lines(logs.String()) {
		if !strings.Contains(line, again) {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		ts, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			t.Fatal(err)
		}
		at = append(at, ts)
	}
	// The log's times are in milliseconds.
	const slack = time.Millisecond
	if d := at[0].Sub(start); d < epoch-slack {
		t.Errorf("the first late read %v after the start, want at least an epoch (%v)", d, epoch)
	}
	if d := at[1].Sub(at[0]); d < 2*epoch-slack {
		t.Errorf("the second late read %v after the first, want at least two epochs (%v)", d, 2*epoch)
	}
}

// longHistory is a config source whose history holds more configs than a
// chain: a read gives at most max of them, and records how many it gave.
type longHistory struct {
	*configtest.Source
	cfg  *config.Config
	gave *int
}

func (h longHistory) History(_ context.Context, from, _ int64, max int) ([]configstore.Committed, error) {
	var read []configstore.Committed
	for i := range min(max, 2*regionsync.MaxChain) {
		read = append(read, configstore.Committed{Rev: from + int64(i), Cfg: h.cfg})
	}
	*h.gave = len(read)
	return read, nil
}

// TestLongHistoryFillsTheChainWithoutDroppingARead: a start whose region
// committed more configs since its last confirmation than a chain holds
// reads as many as the chain holds beside the one it starts on, and keeps
// every one it read: none it may still be bounded by is dropped for the
// live one.
func TestLongHistoryFillsTheChainWithoutDroppingARead(t *testing.T) {
	rdb := redistest.Start(t).Client()
	ctx := t.Context()
	if err := rdb.Set(ctx, "sl:confirmed", "10", 0).Err(); err != nil {
		t.Fatal(err)
	}
	gave := 0
	src := longHistory{Source: configtest.NewSource(euWeighted(t, "", 3), 100), cfg: euWeighted(t, "", 1), gave: &gave}
	s, err := New(Options{Region: "eu", Redis: rdb, Config: src, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.ResumeChain(ctx); err != nil {
		t.Fatal(err)
	}
	c := s.chain.Load()
	if c.Len() != regionsync.MaxChain || c.Len() != gave+1 || c.Current().Rev != 100 {
		t.Fatalf("a chain of %d running %d from %d configs read, want the %d a chain holds: those read and the live 100",
			c.Len(), c.Current().Rev, gave, regionsync.MaxChain)
	}
}

// TestStaticConfigReadsNoHistory: a process on a config of no revision (a
// static file) has no region history to read: its start reads nothing,
// so a Redis that refuses its connection then neither fails it nor counts
// it unconfirmed.
func TestStaticConfigReadsNoHistory(t *testing.T) {
	rdb := refusingRedis(t)
	s, err := New(Options{Region: "eu", Redis: rdb, Config: configtest.NewSource(euWeighted(t, "", 3), 0), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.ResumeChain(t.Context()); err != nil {
		t.Fatalf("ResumeChain on a static config: %v, want nothing read", err)
	}
}

// refusingRedis is a client of an address nothing listens on, with one
// dial a command and no retry: every command fails at once, connection
// refused.
func refusingRedis(t *testing.T) *redis.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
