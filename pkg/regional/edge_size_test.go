package regional_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/pkg/regional"
)

// TestMessageOfMaxBytesIsReadAndOnePastIsRefused: the daemon reads a
// request of exactly 1 MiB, the documented message size bound (whatever
// its handler then says of it), and refuses one a byte longer with
// ResourceExhausted, unread.
func TestMessageOfMaxBytesIsReadAndOnePastIsRefused(t *testing.T) {
	rs := redistest.Start(t)
	_, conn := edgeDaemon(t, rs, regiontest.MustConfig(t, edgeConfig))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := sluicev1.NewLeaseServiceClient(conn)
	// sized is a Sync request of exactly n bytes, padded in its instance id.
	sized := func(n int) *sluicev1.SyncRequest {
		req := &sluicev1.SyncRequest{}
		for pad := n; pad > 0; pad-- {
			req.InstanceId = strings.Repeat("x", pad)
			if proto.Size(req) <= n {
				break
			}
		}
		if got := proto.Size(req); got != n {
			t.Fatalf("padded request of %d bytes, want %d", got, n)
		}
		return req
	}
	const bound = 1 << 20 // docs/operations.md, "Request bounds"
	if regional.MaxMessageBytes != bound {
		t.Fatalf("MaxMessageBytes %d, the documented bound is %d", regional.MaxMessageBytes, bound)
	}
	_, err := client.Sync(ctx, sized(bound))
	if status.Code(err) == codes.ResourceExhausted {
		t.Fatalf("a request of %d bytes refused as too large: %v", bound, err)
	}
	_, err = client.Sync(ctx, sized(bound+1))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a request of %d bytes: got %v, want ResourceExhausted", bound+1, err)
	}
}
