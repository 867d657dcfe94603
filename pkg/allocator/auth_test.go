package allocator_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/etcdtest"
	"github.com/sluicehq/sluice/internal/tlstest"
	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

const authRegions = twoRegions + `
auth:
  identities:
    - {match: spiffe://sluice.test/region/a, roles: "region:a"}
    - {match: spiffe://sluice.test/region/b, roles: "region:b"}
    - {match: spiffe://sluice.test/instance, roles: instance}
    - {match: spiffe://sluice.test/operator, roles: operator}
`

// mtlsPKI writes a CA, a server certificate for 127.0.0.1 and one client
// certificate per name (SAN URI spiffe://sluice.test/<name>).
func mtlsPKI(t *testing.T, clients ...string) *tlstest.PKI {
	t.Helper()
	leaves := []tlsconfig.Leaf{{Name: "server", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true}}
	for _, c := range clients {
		leaves = append(leaves, tlsconfig.Leaf{Name: strings.ReplaceAll(c, "/", "-"), URIs: []string{"spiffe://sluice.test/" + c}, Client: true})
	}
	return tlstest.Write(t, leaves...)
}

func dialAs(t *testing.T, pki *tlstest.PKI, addr, name string) sluicev1.AllocatorServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(pki.Creds(t, strings.ReplaceAll(name, "/", "-"), "")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return sluicev1.NewAllocatorServiceClient(conn)
}

// TestCallersOnlyDoWhatTheirRoleAllows runs the global tier with mutual
// TLS: a region's certificate reporting for another region is refused with
// PermissionDenied and nothing moves (the other region stays unheard, the
// caller's own region keeps its grant); an instance certificate may call
// nothing on the AllocatorService; the operator may read Status.
func TestCallersOnlyDoWhatTheirRoleAllows(t *testing.T) {
	srv := etcdtest.Start(t)
	pki := mtlsPKI(t, "region/a", "instance", "operator")
	serverTLS := pki.Server(t, "server")
	d, err := allocator.StartDaemon(context.Background(), allocator.DaemonOptions{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Etcd: srv.Client(t), Prefix: "/test",
		// One replica leads throughout (its Stop resigns): with a session
		// of 1 s it lost the leadership on a starved machine and region a
		// was told "not leader; leader=" where its role was judged.
		SessionTTL: 60 * time.Second, Config: allocator.StaticConfig{C: mustConfig(t, authRegions)},
		ServerTLS: serverTLS, DrainTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(&testWriter{t: t}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	waitFor(t, 10*time.Second, "the replica leads", d.IsLeader)

	a := dialAs(t, pki, d.GRPCAddr(), "region/a")
	first, err := a.Sync(rpcCtx(t), report("a", 1, demand("acme", 10)))
	if err != nil {
		t.Fatalf("region a's own report: %v", err)
	}
	// a claims to be b.
	_, err = a.Sync(rpcCtx(t), report("b", 1, demand("acme", 1000)))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `needs role "region:b"`) {
		t.Fatalf("region a reporting for b: %v, want PermissionDenied naming region:b", err)
	}
	// A page of a paged report, or a request for a page of its answer,
	// is scoped the same way.
	for _, p := range []*sluicev1.RegionReport{
		{Region: "b", Seq: 1, Page: 0, Pages: 2, Keys: []*sluicev1.KeyDemand{demand("acme", 1000)}},
		{Region: "b", Seq: 1, AnswerPage: 1},
	} {
		_, err = a.SyncPage(rpcCtx(t), p)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `needs role "region:b"`) {
			t.Fatalf("region a sending b's page %v: %v, want PermissionDenied naming region:b", p, err)
		}
	}
	if _, err := a.SyncPage(rpcCtx(t), &sluicev1.RegionReport{Region: "a", Seq: 2, Pages: 2, Keys: []*sluicev1.KeyDemand{demand("acme", 10)}}); err != nil {
		t.Fatalf("region a's own page: %v", err)
	}
	op := dialAs(t, pki, d.GRPCAddr(), "operator")
	st, err := op.Status(rpcCtx(t), &sluicev1.StatusRequest{})
	if err != nil {
		t.Fatalf("operator status: %v", err)
	}
	for _, r := range st.Regions {
		if r.Region == "b" && (r.LastSeq != 0 || r.LastReportAgeMs != -1) {
			t.Errorf("the refused report moved region b: %+v", r)
		}
	}
	again, err := a.Sync(rpcCtx(t), report("a", 2, demand("acme", 10)))
	if err != nil {
		t.Fatal(err)
	}
	if first.String() == "" || len(again.GetGrants()) != len(first.GetGrants()) {
		t.Errorf("region a's grants changed after the refused report: %v then %v", first.GetGrants(), again.GetGrants())
	}

	// Watching: a's own nudges, not b's.
	watch := func(c sluicev1.AllocatorServiceClient, region string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 50*testEpoch)
		defer cancel()
		stream, err := c.Watch(ctx, &sluicev1.WatchRequest{Region: region})
		if err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	if err := watch(a, "b"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `needs role "region:b"`) {
		t.Fatalf("region a watching b's nudges: %v, want PermissionDenied naming region:b", err)
	}
	if err := watch(a, "a"); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("region a watching its own nudges: %v, want the stream held open until the caller's deadline", err)
	}

	inst := dialAs(t, pki, d.GRPCAddr(), "instance")
	if _, err := inst.Sync(rpcCtx(t), report("a", 3, demand("acme", 10))); status.Code(err) != codes.PermissionDenied {
		t.Errorf("instance certificate sending a report: %v, want PermissionDenied", err)
	}
	if _, err := inst.Status(rpcCtx(t), &sluicev1.StatusRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("instance certificate reading status: %v, want PermissionDenied", err)
	}
	if _, err := a.Status(rpcCtx(t), &sluicev1.StatusRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("region certificate reading status: %v, want PermissionDenied", err)
	}
	m := scrape(t, d)
	for _, want := range []string{
		`sluice_rpc_denied_total{method="/sluice.v1.AllocatorService/Sync",needs="scoped"} 2`,
		`sluice_rpc_denied_total{method="/sluice.v1.AllocatorService/Status",needs="operator"} 2`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
