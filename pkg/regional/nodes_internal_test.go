package regional

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/luascripts"
)

// TestClusterNodeSkipsThenProbesOneCallAtATime: a master that failed a
// call (a failure of the node) is skipped for one Redis timeout; then one
// call is let through as the probe while the others still fail at once,
// until the probe's verdict: an answer (or an error of the script, which
// the node answered) ends the skipping, a failure starts it again.
func TestClusterNodeSkipsThenProbesOneCallAtATime(t *testing.T) {
	const timeout = 500 * time.Millisecond
	n := &clusterNodes{timeout: timeout}
	nd := &clusterNode{addr: "10.0.0.1:6379"}
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if nd.skipped(t0) {
		t.Fatal("a master that never failed is skipped")
	}
	n.judge(nd, t0, nil) // an answer: nothing to skip
	if nd.skipped(t0) || nd.skipped(t0) {
		t.Fatal("a master that answered is skipped")
	}
	err := n.judge(nd, t0, context.DeadlineExceeded)
	var nf *nodeFailure
	if !errors.As(err, &nf) || nf.node != nd.addr || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("judged failure: %v, want the node's failure wrapping its cause", err)
	}
	for _, at := range []time.Time{t0, t0.Add(timeout - time.Nanosecond)} {
		if !nd.skipped(at) {
			t.Fatalf("skipped at %v after a failure at %v: false, want true for %v", at.Sub(t0), t0, timeout)
		}
	}
	probeAt := t0.Add(timeout)
	if nd.skipped(probeAt) {
		t.Fatal("no probe let through once the Redis timeout has passed")
	}
	for range 3 {
		if !nd.skipped(probeAt) {
			t.Fatal("a second call let through while the probe has no verdict")
		}
	}
	// The probe fails: skipped again for a Redis timeout, then probed.
	n.judge(nd, probeAt, io.EOF)
	if !nd.skipped(probeAt.Add(timeout-time.Nanosecond)) || nd.skipped(probeAt.Add(timeout)) {
		t.Fatal("after a failed probe: want skipped for one Redis timeout, then one probe")
	}
	// The node answers with an error of the script: it answered.
	scriptErr := replyErr("ERR Error running script (call to f_1): attempt to compare nil with number")
	if got := n.judge(nd, probeAt.Add(timeout), scriptErr); got != error(scriptErr) {
		t.Fatalf("a script's error judged as %v, want it unchanged", got)
	}
	if nd.skipped(probeAt.Add(timeout)) || nd.skipped(probeAt.Add(timeout)) {
		t.Fatal("a master that answered (a script's error) still skipped")
	}
}

// TestNodeFailedTellsTheNodeFromTheScript: the errors that say a master
// failed a call (no answer in time, the connection, the cluster refusing
// the slot for now) and those that do not (a script's own error, refused
// input, no error).
func TestNodeFailedTellsTheNodeFromTheScript(t *testing.T) {
	for _, err := range []error{
		context.DeadlineExceeded,
		fmt.Errorf("acquire sl:{t|c}:b: %w", &luascripts.TooLateError{NowUS: 2, DeadlineUS: 1}),
		&net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout")},
		io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
		fmt.Errorf("dial: %w", syscall.ECONNREFUSED), fmt.Errorf("read: %w", syscall.ECONNRESET),
		replyErr("CLUSTERDOWN The cluster is down"),
		fmt.Errorf("lease script sl:{t|c}:b: %w", replyErr("TRYAGAIN Multiple keys request during rehashing of slot")),
		replyErr("LOADING Redis is loading the dataset in memory"),
		replyErr("MASTERDOWN Link with MASTER is down"),
	} {
		if !nodeFailed(err) {
			t.Errorf("nodeFailed(%v) = false, want true", err)
		}
	}
	for _, err := range []error{
		nil,
		replyErr("ERR Error running script: bad argument"),
		replyErr("NOPERM this user has no permissions to run the 'evalsha' command"),
		errors.New("lease: conflict"),
	} {
		if nodeFailed(err) {
			t.Errorf("nodeFailed(%v) = true, want false", err)
		}
	}
}

// replyErr is an error reply of Redis, as go-redis returns it (its own
// type is internal).
type replyErr string

func (e replyErr) Error() string { return string(e) }
