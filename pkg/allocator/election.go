package allocator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/sluicehq/sluice/internal/election"
)

const (
	// electionRetryMin is the first pause after a failed session or
	// campaign; it doubles up to the session TTL.
	electionRetryMin = 50 * time.Millisecond
	// releaseTimeoutMax bounds resigning and revoking the lease; a lease
	// that cannot be revoked expires by itself within one TTL.
	releaseTimeoutMax = 2 * time.Second
)

// elector campaigns for the global leadership in etcd and tells the
// Service when it leads. Its methods run on the daemon's goroutines; it is
// not shared otherwise.
type elector struct {
	cli  *clientv3.Client
	pfx  string        // election prefix; candidates' keys live under pfx + "/"
	addr string        // advertised gRPC address, the value of this replica's key
	ttl  time.Duration // requested session TTL, whole seconds
	svc  *Service
	log  *slog.Logger
	// lapsedKey holds the durable lapsed set (see lapsed.go).
	lapsedKey string

	terms uint64 // sessions started; touched only by run's goroutine
}

// run campaigns until ctx is done, one lease-backed session after
// another. When ctx ends while leading, it stops granting first and then
// resigns, so a standby takes over at once.
func (e *elector) run(ctx context.Context) {
	wait := electionRetryMin
	for ctx.Err() == nil {
		led, err := e.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			e.log.Warn("leader election interrupted; campaigning again", "retry_in", wait, "error", err)
		}
		if led {
			wait = electionRetryMin
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		wait = min(2*wait, e.ttl)
	}
}

// session runs one lease: campaign, lead until the lease is lost or ctx
// ends, release. led says whether it won.
func (e *elector) session(ctx context.Context) (led bool, err error) {
	ttlSeconds := int64(e.ttl / time.Second)
	sent := time.Now()
	gctx, cancel := context.WithTimeout(ctx, e.ttl)
	lease, err := e.cli.Grant(gctx, ttlSeconds)
	cancel()
	if err != nil {
		return false, fmt.Errorf("grant session lease: %w", err)
	}
	// etcd may raise a TTL below its minimum; it expires the lease by the
	// granted TTL, so that is the one to count with.
	ka := &keepalive{ttl: time.Duration(lease.TTL) * time.Second, confirmed: sent, lost: make(chan struct{})}
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
		e.revoke(lease.ID, ka.ttl)
	}()
	// The session refreshes the lease on its own stream as well; the
	// keepalive below exists to know when each refresh was sent.
	sess, err := concurrency.NewSession(e.cli, concurrency.WithLease(lease.ID),
		concurrency.WithTTL(int(lease.TTL)), concurrency.WithContext(sctx))
	if err != nil {
		return false, fmt.Errorf("start session: %w", err)
	}
	e.terms++
	term := e.terms
	wg.Go(func() { ka.run(sctx, e, lease.ID, term) })

	el := concurrency.NewElection(sess, e.pfx)
	cctx, stopCampaign := context.WithCancel(sctx)
	defer stopCampaign()
	wg.Go(func() {
		select {
		case <-ka.lost:
		case <-sess.Done():
		case <-cctx.Done():
		}
		stopCampaign()
	})
	if err := election.Campaign(cctx, el, e.addr); err != nil {
		if ctx.Err() != nil {
			return false, nil
		}
		return false, fmt.Errorf("campaign: %w", err)
	}
	// Campaign also returns when this replica's own key vanished with a
	// lapsed lease; only a key still held under our lease means we won.
	if err := election.Confirm(sctx, e.cli, el, lease.ID, e.ttl); err != nil {
		return false, err
	}
	// Read after winning: a previous leader's last write of the set either
	// landed before (read here) or found its election key gone (refused).
	rctx, cancel := context.WithTimeout(sctx, e.ttl)
	lapsed, err := ReadLapsed(rctx, e.cli, e.lapsedKey)
	cancel()
	if err != nil {
		return false, err
	}
	// Before the first term: grants of a longer validity committed before
	// this replica started may still be held (Service.learnPriorTiming).
	rctx, cancel = context.WithTimeout(sctx, e.ttl)
	err = e.svc.learnPriorTiming(rctx)
	cancel()
	if err != nil {
		return false, fmt.Errorf("read the configs committed before this replica's first: %w", err)
	}
	if !e.svc.promote(term, ka.deadline(), lapsed) {
		return false, errors.New("session lease not confirmed recently enough to lead")
	}
	electionKey, electionRev := el.Key(), el.Rev()
	wg.Go(func() { e.persistLapses(sctx, electionKey, electionRev) })
	e.log.Info("leading the global tier", "advertise", e.addr, "lease", fmt.Sprintf("%x", lease.ID), "ttl", ka.ttl, "lapsed", lapsed)
	reason := "shutting down"
	select {
	case <-ctx.Done():
	case <-ka.lost:
		reason = "session lease refresh lapsed or lease gone"
	case <-sess.Done():
		reason = "session ended"
	}
	// Stop granting before anything else, so that no answer can follow
	// the moment a standby may take over.
	e.svc.demote(term)
	if ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.Background(), min(ka.ttl, releaseTimeoutMax))
		if err := el.Resign(rctx); err != nil {
			e.log.Warn("resign failed; the standby takes over when the lease expires", "error", err)
		}
		cancel()
	}
	if ctx.Err() != nil {
		e.log.Info("stopped leading the global tier", "reason", reason)
	} else {
		e.log.Warn("stopped leading the global tier", "reason", reason)
	}
	return true, nil
}

// revoke ends the lease so its keys vanish now rather than after the TTL.
func (e *elector) revoke(id clientv3.LeaseID, ttl time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), min(ttl, releaseTimeoutMax))
	defer cancel()
	if _, err := e.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		e.log.Debug("revoke session lease failed; it expires by itself", "error", err)
	}
}

// keepalive refreshes one session lease itself, timing each refresh from
// when it was sent: the lease then lives in etcd at least until
// sent + TTL, so leading until sent + TTL/2 leaves half a TTL of margin
// for clock rates and scheduling before anyone else can win.
type keepalive struct {
	ttl  time.Duration
	lost chan struct{} // closed when the lease is gone or its refresh lapsed

	mu        sync.Mutex // guards confirmed
	confirmed time.Time  // send time of the newest confirmed refresh (or of the grant)
}

// deadline is when this session must stop granting unless refreshed.
func (k *keepalive) deadline() time.Time {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.confirmed.Add(k.ttl / 2)
}

func (k *keepalive) run(ctx context.Context, e *elector, id clientv3.LeaseID, term uint64) {
	// Six refreshes per TTL: two may fail before the TTL/2 deadline.
	ticker := time.NewTicker(max(k.ttl/6, 10*time.Millisecond))
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if !time.Now().Before(k.deadline()) {
			close(k.lost)
			return
		}
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, k.ttl/3)
		_, err := e.cli.KeepAliveOnce(rctx, id)
		cancel()
		switch {
		case err == nil:
			k.mu.Lock()
			k.confirmed = sent
			k.mu.Unlock()
			e.svc.extend(term, sent.Add(k.ttl/2))
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			close(k.lost)
			return
		case ctx.Err() != nil:
			return
		default:
			e.log.Debug("session lease refresh failed", "error", err)
		}
	}
}

// observe follows who leads, for the redirect in "not leader" answers,
// until ctx is done.
func (e *elector) observe(ctx context.Context) {
	wait := electionRetryMin
	for ctx.Err() == nil {
		err := e.observeOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			wait = electionRetryMin
			continue
		}
		e.log.Debug("leader observation interrupted", "retry_in", wait, "error", err)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		wait = min(2*wait, e.ttl)
	}
}

// observeOnce reads the current leader (the oldest candidate key) and
// waits for the next change of any candidate.
func (e *elector) observeOnce(ctx context.Context) error {
	prefix := e.pfx + "/"
	gctx, cancel := context.WithTimeout(ctx, e.ttl)
	resp, err := e.cli.Get(gctx, prefix, clientv3.WithFirstCreate()...)
	cancel()
	if err != nil {
		return fmt.Errorf("read the leader: %w", err)
	}
	leader := ""
	if len(resp.Kvs) > 0 {
		leader = string(resp.Kvs[0].Value)
	}
	e.svc.observeLeader(leader)
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range e.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch the election: %w", err)
		}
		if len(wr.Events) > 0 {
			return nil
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return errors.New("election watch closed")
}
