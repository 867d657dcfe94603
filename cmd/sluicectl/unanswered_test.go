package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
)

// TestWriteWithoutAnswerSaysItMayHaveLanded: etcd commits an apply's
// transaction but its answer never comes back (etcd hung, the network
// failed after the request, SIGINT while waiting). apply said "nothing
// was written" (interrupted) or only that etcd could not be used (timed
// out) while the change was live in etcd. It must not claim nothing was
// written, and says what etcd holds when it can read it.
func TestWriteWithoutAnswerSaysItMayHaveLanded(t *testing.T) {
	c := newCluster(t)
	wantCode(t, sluicectl(t, "", c.args("apply", "-f", sample(t), "-yes")...), exitOK)
	for _, tc := range []struct {
		name      string
		interrupt bool
		code      int
	}{{"timed out", false, exitUnreachable}, {"interrupted", true, exitInterrupted}} {
		t.Run(tc.name, func(t *testing.T) {
			_, readRev := c.config(t)
			link := c.srv.Link(t)
			flags := []string{"-etcd-endpoints", strings.Join(link.Endpoints(), ","), "-etcd-prefix", "/sluicectl-test", "-timeout", "2s"}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			a := &app{beforeWrite: func() {
				// The transaction carries the whole document: the first
				// request that large.
				link.HoldRepliesAfter(512)
				if tc.interrupt {
					go func() {
						// The write reaches etcd; then the operator gives up.
						for deadline := time.Now().Add(10 * time.Second); c.revision(t) <= readRev && time.Now().Before(deadline); {
							time.Sleep(5 * time.Millisecond) // polling etcd for the write with a deadline
						}
						cancel()
					}()
				}
			}}
			tier := map[bool]string{false: "pro", true: "free"}[tc.interrupt]
			changed := strings.Replace(string(config.SampleYAML()), "default_tier: free", "default_tier: "+tier, 1)
			if tc.interrupt {
				changed = strings.Replace(changed, "lease_ttl: 5s", "lease_ttl: 6s", 1)
			}
			r := runAppContext(t, ctx, a, append(flags, "apply", "-f", writeFile(t, "changed.yaml", changed), "-yes")...)
			link.Mend()
			wantCode(t, r, tc.code)
			if strings.Contains(r.stderr, "nothing was written") {
				t.Fatalf("stderr claims nothing was written:\n%s", r.stderr)
			}
			_, rev := c.config(t)
			if rev == readRev {
				t.Fatalf("the write did not reach etcd (still at revision %d): the test held the request, not its answer", rev)
			}
			wantContains(t, "stderr", r.stderr, "the change may have been written", "sluicectl get")
		})
	}
}
