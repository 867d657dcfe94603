package regional

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/pkg/luascripts"
)

// clusterNodes keeps the script calls of a region on a Redis Cluster apart
// by the master that holds their key, so that one master down or hung
// costs only its own keys (docs/architecture.md, failure table: "one
// master of a Redis Cluster hung" and "down").
//
// Why: every call used to share one batcher, whose pipelines mixed keys of
// every node and ended when the slowest node answered. A hung master held
// each pipeline it had a key in for the whole RedisTimeout, the four
// workers were soon all stuck on such pipelines, and calls for healthy
// masters waited behind them; a Sync with one key on a failed master
// failed as a whole. So:
//   - each master has its own batcher (pipelines of its keys only);
//   - a master that failed a call (an error of the connection or the
//     cluster, or no answer within RedisTimeout) is skipped for
//     RedisTimeout: its keys' calls fail at once, answered
//     rpcerr.RedisNodeFailedStatus, instead of queueing behind a node that
//     does not answer; the first call after that is sent to it again;
//   - a Sync answers the keys of the other masters (SyncRequest.key_failures).
//
// A key's master is go-redis's view of the slot map (refreshed on MOVED
// and periodically), so a failover moves the key's calls to the promoted
// replica's batcher. Masters that left the cluster keep their idle batcher
// (a few goroutines each) until the server closes: a cluster has a handful
// of masters and changes them rarely.
//
// Safe for concurrent use.
type clusterNodes struct {
	cc       *redis.ClusterClient
	scripts  *luascripts.Scripts
	timeout  time.Duration // RedisTimeout: a pipeline's bound, and how long a failed master is skipped
	workers  int
	maxBatch int

	// byAddr maps a master's address to it: read without a lock on every
	// call, replaced whole (under mu) when a master is first seen.
	byAddr atomic.Pointer[map[string]*clusterNode]
	mu     sync.Mutex
	closed bool // guarded by mu
}

// clusterNode is one master's batcher and its recent failure.
type clusterNode struct {
	addr   string
	client *redis.Client // the master's own client, for the readiness ping
	batch  *batcher
	// skipUntil is when a call for the master's keys is sent to it again
	// after it failed one (Unix ns; 0: it answered the last call judged).
	skipUntil atomic.Int64
	// probing is set while the one call let through after skipUntil (the
	// probe) is out: until its verdict the master's other calls fail at
	// once too, so a master that still does not answer holds one call,
	// not all of them.
	probing atomic.Bool
}

// nodeFailure is a call failed by its key's master: the error of that
// node, or errNodeSkipped.
type nodeFailure struct {
	node string
	err  error
}

func (e *nodeFailure) Error() string { return fmt.Sprintf("redis node %s: %v", e.node, e.err) }
func (e *nodeFailure) Unwrap() error { return e.err }

// errNodeSkipped fails at once a call for a master that failed a call
// within the last RedisTimeout.
var errNodeSkipped = errors.New("failed a call within the last redis timeout; its keys are not sent to it until then")

func newClusterNodes(cc *redis.ClusterClient, scripts *luascripts.Scripts, workers, maxBatch int, timeout time.Duration) *clusterNodes {
	n := &clusterNodes{cc: cc, scripts: scripts, timeout: timeout, workers: workers, maxBatch: maxBatch}
	n.byAddr.Store(&map[string]*clusterNode{})
	return n
}

// node is the master that holds key, as the client's slot map says.
func (n *clusterNodes) node(ctx context.Context, key string) (*clusterNode, error) {
	c, err := n.cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	addr := c.Options().Addr
	if nd := (*n.byAddr.Load())[addr]; nd != nil {
		return nd, nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errors.New("regional server closed")
	}
	old := *n.byAddr.Load()
	if nd := old[addr]; nd != nil {
		return nd, nil
	}
	nd := &clusterNode{addr: addr, client: c, batch: newBatcher(n.cc, n.scripts, n.workers, n.maxBatch, n.timeout)}
	next := make(map[string]*clusterNode, len(old)+1)
	maps.Copy(next, old)
	next[addr] = nd
	n.byAddr.Store(&next)
	return nd, nil
}

// skipped reports whether a call at now must fail at once: nd failed a
// call less than RedisTimeout before now, or did earlier and the call let
// through since (the probe) has no verdict yet. Otherwise the call is
// sent, as the probe when nd failed the last call judged.
func (nd *clusterNode) skipped(now time.Time) bool {
	until := nd.skipUntil.Load()
	switch {
	case until == 0:
		return false
	case now.UnixNano() < until:
		return true
	}
	return !nd.probing.CompareAndSwap(false, true)
}

// judge records what the outcome err of a call to nd says of the node and
// returns err, wrapped as the node's failure when it is one. Errors of the
// script itself (a bug, refused input) say nothing of the node.
func (n *clusterNodes) judge(nd *clusterNode, now time.Time, err error) error {
	defer nd.probing.Store(false)
	switch {
	case err == nil:
		nd.skipUntil.Store(0)
		return nil
	case !nodeFailed(err):
		nd.skipUntil.Store(0)
		return err
	}
	nd.skipUntil.Store(now.Add(n.timeout).UnixNano())
	return &nodeFailure{node: nd.addr, err: err}
}

// do runs one script call for key on its master's batcher (batcher.do),
// and judges the node by the call's outcome, which parse reads from the
// queued call. A master skipped after a failure fails the call at once.
// A caller that gave up (ctx) gets its context's error and no verdict.
func (n *clusterNodes) do(ctx context.Context, key string, queue func(context.Context, redis.Pipeliner) *luascripts.Queued, parse func(*luascripts.Queued) error) error {
	nd, err := n.node(ctx, key)
	if err != nil {
		return err
	}
	if nd.skipped(time.Now()) {
		return &nodeFailure{node: nd.addr, err: errNodeSkipped}
	}
	// A caller that gives up before the node answered (an instance's
	// acquire waits less than RedisTimeout) still leaves a verdict, from
	// the call's own outcome once its pipeline ends: otherwise a hung
	// master whose callers all give up first is never skipped, and every
	// call for its keys waits out its caller's deadline, which the
	// instance counts against the whole region.
	q, pending, err := nd.batch.doThen(ctx, queue, func(q *luascripts.Queued) {
		n.judge(nd, time.Now(), q.Cmd.Err())
	})
	if err != nil {
		if !pending {
			nd.probing.Store(false) // not sent, no verdict: the next call probes
		}
		return err
	}
	return n.judge(nd, time.Now(), parse(q))
}

// split sorts keys by master for a call of many keys (Sync, Release):
// skip[i] is the failure of keys[i] when its master is skipped (nil: send
// it), and nodes[i] its master, for judge. A key whose master is unknown
// (the slot map could not be read) is sent: the call then fails as Redis
// does.
func (n *clusterNodes) split(ctx context.Context, keys []string) (nodes []*clusterNode, skip []error) {
	nodes, skip = make([]*clusterNode, len(keys)), make([]error, len(keys))
	now := time.Now()
	for i, k := range keys {
		nd, err := n.node(ctx, k)
		if err != nil {
			continue
		}
		nodes[i] = nd
		if nd.skipped(now) {
			skip[i] = &nodeFailure{node: nd.addr, err: errNodeSkipped}
		}
	}
	return nodes, skip
}

// known is the masters that have held the key of a call so far.
func (n *clusterNodes) known() []*clusterNode {
	m := *n.byAddr.Load()
	out := make([]*clusterNode, 0, len(m))
	for _, nd := range m {
		out = append(out, nd)
	}
	return out
}

// close stops every master's batcher once its queued calls are done.
func (n *clusterNodes) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	for _, nd := range *n.byAddr.Load() {
		nd.batch.close()
	}
}

// nodeFailed reports whether err, the outcome of a script call, says its
// node failed: no answer within the bound (the pipeline's deadline, or a
// script that ran past its own: a node that queued it), the connection
// (refused, reset, closed, timed out), or the cluster refusing to serve
// the slot for now (CLUSTERDOWN while it marks the node failed, LOADING,
// TRYAGAIN and MASTERDOWN while it rejoins or fails over).
func nodeFailed(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, luascripts.ErrTooLate),
		errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return true
	}
	msg := err.Error()
	for _, p := range []string{"CLUSTERDOWN", "LOADING", "TRYAGAIN", "MASTERDOWN"} {
		if strings.HasPrefix(msg, p) || strings.Contains(msg, ": "+p) {
			return true
		}
	}
	return false
}

// call runs one script call for the Redis key key, batched with other
// callers' (batcher), and parse reads its result; on a Redis Cluster, on
// the batcher of key's master (clusterNodes.do).
func (s *Server) call(ctx context.Context, key string, queue func(context.Context, redis.Pipeliner) *luascripts.Queued, parse func(*luascripts.Queued) error) error {
	if s.nodes != nil {
		return s.nodes.do(ctx, key, queue, parse)
	}
	q, err := s.batch.do(ctx, queue)
	if err != nil {
		return err
	}
	return parse(q)
}

// syncMany runs sync.lua for every item in pipelines (SyncMany). On a
// Redis Cluster the items of a skipped master fail at once, the others'
// pipelines are bounded by RedisTimeout, and each item's outcome judges
// its master (clusterNodes).
func (s *Server) syncMany(ctx context.Context, items []luascripts.SyncItem) []luascripts.SyncResult {
	return manyAcrossNodes(s, ctx, items, func(ctx context.Context, items []luascripts.SyncItem) []luascripts.SyncResult {
		return s.scripts.SyncMany(ctx, s.opts.Redis, items)
	}, func(r *luascripts.SyncResult) *error { return &r.Err })
}

// releaseMany is syncMany for release.lua (ReleaseMany).
func (s *Server) releaseMany(ctx context.Context, items []luascripts.SyncItem) []luascripts.ReleaseResult {
	return manyAcrossNodes(s, ctx, items, func(ctx context.Context, items []luascripts.SyncItem) []luascripts.ReleaseResult {
		return s.scripts.ReleaseMany(ctx, s.opts.Redis, items)
	}, func(r *luascripts.ReleaseResult) *error { return &r.Err })
}

// manyAcrossNodes runs an instance's call of many items through run: on a
// single Redis as one, on a Redis Cluster once per master (acrossNodes),
// each result's error (errp) its master's failure when it is one.
func manyAcrossNodes[R any](s *Server, ctx context.Context, items []luascripts.SyncItem,
	run func(context.Context, []luascripts.SyncItem) []R, errp func(*R) *error) []R {
	if s.nodes == nil {
		return run(ctx, items)
	}
	out := make([]R, len(items))
	s.acrossNodes(ctx, items, func(i int, err error) { *errp(&out[i]) = err }, func(ctx context.Context, idx []int, sent []luascripts.SyncItem) []error {
		res := run(ctx, sent)
		errs := make([]error, len(res))
		for j := range res {
			out[idx[j]], errs[j] = res[j], *errp(&res[j])
		}
		return errs
	})
	return out
}

// acrossNodes is the cluster half of syncMany and releaseMany: fail
// records the failure of the item of a skipped master, and run runs the
// items sent (their indexes idx) and returns their errors, once per
// master, side by side, each bounded by RedisTimeout. The errors judge
// their masters, also when the caller gave up meanwhile; an item's error
// becomes its master's failure (nodeFailure) when it is one. (One
// pipeline of every master's items, go-redis's own split, ended when its
// slowest node did, failing the healthy masters' items with it.)
func (s *Server) acrossNodes(ctx context.Context, items []luascripts.SyncItem, fail func(i int, err error), run func(ctx context.Context, idx []int, sent []luascripts.SyncItem) []error) {
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = it.Keys.Bucket
	}
	nodes, skip := s.nodes.split(ctx, keys)
	groups := map[*clusterNode][]int{}
	for i := range items {
		if skip[i] != nil {
			fail(i, skip[i])
			continue
		}
		groups[nodes[i]] = append(groups[nodes[i]], i)
	}
	// Bounded by RedisTimeout, not by the caller's deadline: an instance's
	// Sync may wait less (its default timeout is refresh / 2) and a hung
	// master must still be judged, or it is never skipped and every Sync
	// with one of its keys fails as a whole.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opts.RedisTimeout)
	defer cancel()
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Go(func() {
			sent := make([]luascripts.SyncItem, len(idx))
			for j, i := range idx {
				sent[j] = items[i]
			}
			for j, err := range run(rctx, idx, sent) {
				errs[idx[j]] = err
			}
		})
	}
	wg.Wait()
	now := time.Now()
	for nd, idx := range groups {
		if nd == nil {
			continue // master unknown: the call failed as Redis does
		}
		for _, i := range idx {
			if jerr := s.nodes.judge(nd, now, errs[i]); jerr != errs[i] {
				fail(i, jerr)
			}
		}
	}
}

// countErrs is the number of results that failed.
func countErrs(results []luascripts.SyncResult) int {
	n := 0
	for _, r := range results {
		if r.Err != nil {
			n++
		}
	}
	return n
}
