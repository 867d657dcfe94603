package allocator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// Client is the region side of AllocatorService: it finds the replica
// that leads among a list of addresses and follows "not leader" redirects.
// Safe for concurrent use.
type Client struct {
	addrs    []string
	dialOpts []grpc.DialOption

	mu       sync.Mutex // guards every field below
	conns    map[string]*grpc.ClientConn
	leader   string // address that answered last; tried first
	next     int    // index in addrs to start from when leader is unknown
	closed   bool
	pageKeys int // keys per report message; 0: DefaultMaxKeysPerPage
}

// MaxReconnectDelay caps the wait between two attempts to reconnect to a
// global replica. gRPC's default backoff grows, roughly doubling, to
// 120 s: a replica that was down for a few minutes and came back (on the
// same address, as a VM or a fixed pod address does) was first tried
// again up to two minutes later, while it led and the regions, unable to
// report, let their static leases lapse to their floors. The cap is the
// scale of an epoch: a region reports once per epoch.
const MaxReconnectDelay = time.Second

// ConnectTimeout bounds one attempt to connect to a global replica: the
// TCP connection, TLS and the HTTP/2 handshake. An attempt that lands on
// an address that accepts and never answers (a path that drops packets, a
// proxy or gateway whose upstream is cut off, a paused process) is given
// up after it and made again. With gRPC's default, 20 s, an attempt made
// during a partition held the region until it ran out: a region whose
// path to the global tier came back stayed unable to report, on its
// floor, for up to 20 s more (measured: a 6 s cut kept a region from
// reporting for 20.8 s, 15 s of it after the path was back). Five seconds
// leave room for a handshake over a slow or lossy link (a lost SYN costs
// 1 s, a lost second one 2 s more) and bound the wait after a partition
// to ConnectTimeout + MaxReconnectDelay.
const ConnectTimeout = 5 * time.Second

// connectParams keep gRPC's backoff (1 s base, 1.6 multiplier, 0.2
// jitter), capped at MaxReconnectDelay, and give up an attempt after
// ConnectTimeout.
func connectParams() grpc.ConnectParams {
	b := backoff.DefaultConfig
	b.MaxDelay = MaxReconnectDelay
	return grpc.ConnectParams{Backoff: b, MinConnectTimeout: ConnectTimeout}
}

// NewClient makes a client for the replicas at addrs (host:port, at least
// one). dialOpts must include transport credentials
// (grpc.WithTransportCredentials). Connections are made lazily and cached
// per address, redirect targets included, and try again at most
// MaxReconnectDelay apart while a replica is unreachable, an attempt left
// unanswered being given up after ConnectTimeout (dialOpts may set other
// grpc.WithConnectParams).
func NewClient(addrs []string, dialOpts ...grpc.DialOption) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("allocator client: no addresses given")
	}
	for i, a := range addrs {
		if a == "" {
			return nil, fmt.Errorf("allocator client: addrs[%d] is empty", i)
		}
	}
	opts := append([]grpc.DialOption{grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes)),
		grpc.WithConnectParams(connectParams())}, dialOpts...)
	return &Client{addrs: slices.Clone(addrs), dialOpts: opts, conns: make(map[string]*grpc.ClientConn)}, nil
}

// Sync sends rep to the leader and returns its answer. A report of more
// keys than one page (SetPageKeys, default DefaultMaxKeysPerPage) is sent
// in pages and its answer assembled (syncPaged); it returns the same
// RegionGrants a report of one message gets. The leader is found as
// leaderCall finds it.
func (c *Client) Sync(ctx context.Context, rep *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	if len(rep.GetKeys()) > c.pageSize() {
		return c.syncPaged(ctx, rep)
	}
	resp, _, err := c.leaderCall(ctx, "sync", func(ctx context.Context, api sluicev1.AllocatorServiceClient) (*sluicev1.RegionGrants, error) {
		return api.Sync(ctx, rep)
	})
	return resp, err
}

// leaderCall makes call on the leader and says which replica answered. It
// tries the replica that answered last, then the others in order; a
// replica answering "not leader; leader=X" sends it to X once (not
// further). A refusal that another replica would repeat (InvalidArgument,
// Aborted for a stale seq) is returned at once. When ctx has a deadline
// and more replicas remain, one attempt gets at most half of the time
// left, so a replica that does not answer cannot use it all. what names
// the call in errors.
func (c *Client) leaderCall(ctx context.Context, what string, call regionCall) (*sluicev1.RegionGrants, string, error) {
	var errs []error
	order := c.order()
	tried := make(map[string]bool, len(order))
	untried := func() bool {
		for _, a := range order {
			if !tried[a] {
				return true
			}
		}
		return false
	}
	for _, addr := range order {
		if tried[addr] {
			continue
		}
		tried[addr] = true
		resp, err := c.attempt(ctx, addr, call, untried())
		if err == nil {
			c.answered(addr)
			return resp, addr, nil
		}
		if final(err) || ctx.Err() != nil {
			return nil, "", fmt.Errorf("allocator client: %s via %s: %w", what, addr, err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if target, ok := NotLeaderAddr(err); ok && target != "" && !tried[target] {
			tried[target] = true
			resp, err := c.attempt(ctx, target, call, untried())
			if err == nil {
				c.answered(target)
				return resp, target, nil
			}
			if final(err) || ctx.Err() != nil {
				return nil, "", fmt.Errorf("allocator client: %s via %s (redirected from %s): %w", what, target, addr, err)
			}
			errs = append(errs, fmt.Errorf("%s (redirected from %s): %w", target, addr, err))
		}
		c.failed(addr)
	}
	return nil, "", fmt.Errorf("allocator client: %s: no replica answered as leader: %w", what, errors.Join(errs...))
}

// regionCall is one AllocatorService call answered with RegionGrants.
type regionCall func(ctx context.Context, api sluicev1.AllocatorServiceClient) (*sluicev1.RegionGrants, error)

// final errors would be the same from every replica.
func final(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.Aborted, codes.Unauthenticated, codes.PermissionDenied:
		return true
	}
	return false
}

// order is the address list starting with the last leader, then from next.
func (c *Client) order() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.addrs)+1)
	if c.leader != "" {
		out = append(out, c.leader)
	}
	for i := range c.addrs {
		out = append(out, c.addrs[(c.next+i)%len(c.addrs)])
	}
	return out
}

func (c *Client) answered(addr string) {
	c.mu.Lock()
	c.leader = addr
	c.mu.Unlock()
}

// failed moves the next start past addr, so a replica that hangs costs
// one attempt per call at most once.
func (c *Client) failed(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == addr {
		c.leader = ""
	}
	if i := slices.Index(c.addrs, addr); i >= 0 && c.addrs[c.next] == addr {
		c.next = (i + 1) % len(c.addrs)
	}
}

func (c *Client) attempt(ctx context.Context, addr string, call regionCall, more bool) (*sluicev1.RegionGrants, error) {
	conn, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok && more {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Until(deadline)/2)
		defer cancel()
	}
	return call(ctx, sluicev1.NewAllocatorServiceClient(conn))
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("client is closed")
	}
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.dialOpts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// Close closes every connection. Sync fails afterwards.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for addr, cc := range c.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", addr, err))
		}
		delete(c.conns, addr)
	}
	return errors.Join(errs...)
}

// Watch keeps a Watch stream open to the leader of the replicas for region
// and calls nudge (from Watch's goroutine; it must not block) for every
// nudge received, until ctx ends; then it returns. It starts with the
// replica Sync last reached, follows "not leader" redirects (also when an
// open stream ends with one, as when that replica stops leading), and
// after a round in which no replica held a stream open it waits retry
// before the next. A replica that does not serve Watch (an older release)
// is retried only every ten retries. Nudges only hasten reports, so a
// region whose stream is down loses speed, never safety.
func (c *Client) Watch(ctx context.Context, region string, retry time.Duration, nudge func()) {
	for ctx.Err() == nil {
		opened := false
		unimplemented := false
		tried := map[string]bool{}
		queue := c.order()
		for len(queue) > 0 && ctx.Err() == nil {
			addr := queue[0]
			queue = queue[1:]
			if tried[addr] {
				continue
			}
			tried[addr] = true
			ok, err := c.watchOnce(ctx, addr, region, nudge)
			opened = opened || ok
			if status.Code(err) == codes.Unimplemented {
				unimplemented = true
			}
			if target, isRedirect := NotLeaderAddr(err); isRedirect && target != "" && !tried[target] {
				queue = append([]string{target}, queue...)
			}
		}
		if opened {
			continue // a leader's stream ended: look for the next one at once
		}
		wait := retry
		if unimplemented {
			wait = 10 * retry
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// watchOnce runs one Watch stream on addr until it fails or ctx ends;
// opened says whether a nudge came on it.
func (c *Client) watchOnce(ctx context.Context, addr, region string, nudge func()) (opened bool, err error) {
	conn, err := c.conn(addr)
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := sluicev1.NewAllocatorServiceClient(conn).Watch(ctx, &sluicev1.WatchRequest{Region: region})
	if err != nil {
		return false, err
	}
	// A server-streaming call reports a refusal at the first Recv.
	for {
		if _, err := stream.Recv(); err != nil {
			return opened, err
		}
		opened = true
		nudge()
	}
}
