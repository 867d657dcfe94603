package allocator

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// pagedTries is how many times Client sends a paged report from page 0
// when the replica that took its first pages can no longer continue it
// (a leader change, a page lost, a config change).
const pagedTries = 3

// SetPageKeys sets the most keys Client puts in one report message; a
// larger report is sent in pages. It must not exceed the global tier's
// MaxKeysPerPage. n < 1 restores the default, DefaultMaxKeysPerPage.
func (c *Client) SetPageKeys(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pageKeys = max(n, 0)
}

func (c *Client) pageSize() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pageKeys > 0 {
		return c.pageKeys
	}
	return DefaultMaxKeysPerPage
}

// syncPaged sends rep in pages of at most pageSize keys and assembles
// the answer. When the replica that took the first pages cannot continue
// the report (it stopped leading, lost them, or the config changed:
// Aborted, FailedPrecondition, or no answer) the whole report is sent
// again from page 0, to the leader found anew, at most pagedTries times
// in all; retries of one seq are idempotent, the allocator answers a seq
// it already took with the answer it gave.
func (c *Client) syncPaged(ctx context.Context, rep *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	pages := splitReport(rep, c.pageSize())
	var errs []error
	for try := 1; ; try++ {
		out, err := c.sendPages(ctx, pages)
		if err == nil {
			return out, nil
		}
		errs = append(errs, err)
		if !restartable(err) || ctx.Err() != nil || try == pagedTries {
			return nil, fmt.Errorf("allocator client: paged report of %d keys in %d pages, seq %d (%d tries): %w",
				len(rep.GetKeys()), len(pages), rep.GetSeq(), try, errors.Join(errs...))
		}
	}
}

// pageError is a failure after page 0 was taken: the report may be sent
// again from page 0 unless the replica refused what was sent.
type pageError struct{ err error }

func (e pageError) Error() string { return e.err.Error() }
func (e pageError) Unwrap() error { return e.err }

// restartable says whether a failed paged report may be sent again from
// page 0: any failure after page 0 was taken, but a refusal of its
// content (InvalidArgument, PermissionDenied, Unauthenticated).
func restartable(err error) bool {
	var pe pageError
	if !errors.As(err, &pe) {
		return false
	}
	switch status.Code(pe.err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated:
		return false
	}
	return true
}

// sendPages sends the pages of one report: page 0 to the leader, found as
// Sync finds it, then the others in order to the replica that took it,
// then fetches the answer's other pages from it.
func (c *Client) sendPages(ctx context.Context, pages []*sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	resp, addr, err := c.leaderCall(ctx, "sync page 0", func(ctx context.Context, api sluicev1.AllocatorServiceClient) (*sluicev1.RegionGrants, error) {
		return api.SyncPage(ctx, pages[0])
	})
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return nil, fmt.Errorf("%w (the global tier does not take paged reports: upgrade it)", err)
		}
		return nil, err
	}
	for i := 1; i < len(pages); i++ {
		if err := checkPageAck(resp, pages[i-1]); err != nil {
			return nil, err
		}
		if resp, err = c.call(ctx, addr, pages[i]); err != nil {
			if status.Code(err) != codes.Aborted {
				c.failed(addr) // the next try starts elsewhere
			}
			return nil, pageError{fmt.Errorf("allocator client: sync page %d via %s: %w", i, addr, err)}
		}
	}
	return c.fetchAnswer(ctx, addr, pages[0], resp)
}

// checkPageAck checks the answer to page, which is not the last.
func checkPageAck(resp *sluicev1.RegionGrants, page *sluicev1.RegionReport) error {
	if resp.GetSeq() != page.GetSeq() || resp.GetPagesReceived() != page.GetPage()+1 {
		return fmt.Errorf("allocator client: page %d of seq %d answered with seq %d, pages_received %d: want seq %d, pages_received %d",
			page.GetPage(), page.GetSeq(), resp.GetSeq(), resp.GetPagesReceived(), page.GetSeq(), page.GetPage()+1)
	}
	return nil
}

// fetchAnswer completes first, the first page of the answer to the
// report whose page 0 is head, with its other pages from addr.
func (c *Client) fetchAnswer(ctx context.Context, addr string, head *sluicev1.RegionReport, first *sluicev1.RegionGrants) (*sluicev1.RegionGrants, error) {
	if first.GetSeq() != head.GetSeq() || first.GetPage() != 0 {
		return nil, fmt.Errorf("allocator client: the answer to seq %d came as page %d of seq %d", head.GetSeq(), first.GetPage(), first.GetSeq())
	}
	out := first
	for i := uint32(1); i < first.GetPages(); i++ {
		req := &sluicev1.RegionReport{Region: head.GetRegion(), Seq: head.GetSeq(), Pages: head.GetPages(), AnswerPage: i, Shard: head.Shard}
		resp, err := c.call(ctx, addr, req)
		if err != nil {
			return nil, pageError{fmt.Errorf("allocator client: answer page %d of seq %d via %s: %w", i, head.GetSeq(), addr, err)}
		}
		if resp.GetSeq() != head.GetSeq() || resp.GetPage() != i || resp.GetPages() != first.GetPages() {
			return nil, fmt.Errorf("allocator client: answer page %d of %d of seq %d came as page %d of %d of seq %d",
				i, first.GetPages(), head.GetSeq(), resp.GetPage(), resp.GetPages(), resp.GetSeq())
		}
		out.Grants = append(out.Grants, resp.GetGrants()...)
	}
	out.Page, out.Pages = 0, 0
	return out, nil
}

// call sends one page (or answer page request) to addr: the replica that
// holds the report's first pages, and only it.
func (c *Client) call(ctx context.Context, addr string, req *sluicev1.RegionReport) (*sluicev1.RegionGrants, error) {
	conn, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	return sluicev1.NewAllocatorServiceClient(conn).SyncPage(ctx, req)
}

// splitReport cuts rep into pages of at most n keys (n >= 1), in order.
// Every page carries the region, seq and page count; page 0 also the
// config revisions and the static lease. The pages share rep's keys.
func splitReport(rep *sluicev1.RegionReport, n int) []*sluicev1.RegionReport {
	keys := rep.GetKeys()
	count := max(1, (len(keys)+n-1)/n)
	pages := make([]*sluicev1.RegionReport, count)
	for i := range pages {
		from, to := i*n, min((i+1)*n, len(keys))
		pages[i] = &sluicev1.RegionReport{
			Region: rep.GetRegion(), Seq: rep.GetSeq(), Keys: keys[from:to:to],
			Page: uint32(i), Pages: uint32(count), Shard: rep.Shard,
		}
	}
	pages[0].ConfigRevisions = rep.GetConfigRevisions()
	pages[0].StaticValidMs = rep.GetStaticValidMs()
	return pages
}
