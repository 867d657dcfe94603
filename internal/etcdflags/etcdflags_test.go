package etcdflags

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/etcdtest"
)

func TestRegisterAndClientErrors(t *testing.T) {
	var a Access
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	a.Register(fs)
	if err := fs.Parse([]string{"-etcd-ca", "/nonexistent/ca.pem", "-etcd-username", "u", "-etcd-password", "p"}); err != nil {
		t.Fatal(err)
	}
	if a.CA != "/nonexistent/ca.pem" || a.Username != "u" || a.Password != "p" {
		t.Fatalf("flags not bound: %+v", a)
	}
	if _, err := a.Client([]string{"127.0.0.1:1"}); err == nil || !strings.HasPrefix(err.Error(), "etcd: ") {
		t.Fatalf("a CA that cannot be read: %v, want an etcd: error naming it", err)
	}
}

// TestClientRedialsEtcdSoonAfterALongOutage: a daemon's etcd client that
// lost etcd for many attempts reaches it again within a few of
// Reconnect's longest waits once it is back. With gRPC's default backoff
// the wait after the sixth failed attempt is about ten seconds (1 s ×
// 1.6^5), and grows with the outage, so every region waited that long for
// its leader, its reports and the etcd rule of its static lease after
// etcd returned.
func TestClientRedialsEtcdSoonAfterALongOutage(t *testing.T) {
	srv := etcdtest.Start(t)
	link := srv.Link(t)
	cli, err := (&Access{}).Client(link.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	// Cut until the client failed to reach etcd six times: with Reconnect
	// that takes about six seconds, with gRPC's default about seventeen,
	// and its next attempt comes about ten seconds later.
	link.Cut()
	const attempts = 6
	deadline := time.Now().Add(time.Minute)
	for link.Refused() < attempts {
		if time.Now().After(deadline) {
			t.Fatalf("the client tried to reach etcd only %d times in a minute", link.Refused())
		}
		// A call keeps the client dialing, as a daemon's session does.
		c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		cli.Get(c, "k")
		cancel()
	}
	link.Mend()
	back := time.Now()
	wait := 5 * MaxReconnectDelay
	c, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if _, err := cli.Get(c, "k"); err != nil {
		t.Fatalf("after %d failed attempts the client did not reach etcd within %v of its return: %v", attempts, wait, err)
	}
	t.Logf("reached etcd %v after it was back, %d attempts refused", time.Since(back).Round(time.Millisecond), link.Refused())
}

// TestCheckEndpointsRefusesWhatTheClientCannotDial: host:port and URLs of
// the etcd client's schemes pass; a malformed address, a host or port
// left out, another scheme or none at all is refused naming the endpoint,
// before a client would retry it until its dial timeout.
func TestCheckEndpointsRefusesWhatTheClientCannotDial(t *testing.T) {
	for _, ok := range [][]string{
		{"127.0.0.1:2379"}, {"etcd-0.etcd:2379", "etcd-1.etcd:2379"}, {"[::1]:2379"},
		{"http://127.0.0.1:2379"}, {"https://etcd.example:2379"}, {"unix:///run/etcd.sock"}, {"unixs://etcd.sock"},
	} {
		if err := CheckEndpoints(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"nohostport", ":2379", "127.0.0.1:", "http://[::1", "http://:2379", "ftp://etcd:2379", "unix://"} {
		err := CheckEndpoints([]string{"127.0.0.1:2379", bad})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("%q: %v; want it refused, named", bad, err)
		}
	}
	if err := CheckEndpoints(nil); err == nil {
		t.Error("no endpoint accepted")
	}
}
