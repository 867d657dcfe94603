// Package etcdflags holds the etcd access flags the daemons share
// (-etcd-ca, -etcd-cert, -etcd-key, -etcd-username, -etcd-password) and
// makes the client from them, so every command reaches etcd the same way.
package etcdflags

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// DialTimeout bounds connecting to etcd.
const DialTimeout = 10 * time.Second

// MaxReconnectDelay caps the wait between two attempts of a daemon's
// etcd client to reach etcd again after losing it (Reconnect).
const MaxReconnectDelay = time.Second

// Reconnect is how a daemon's etcd client dials etcd again after losing
// it: gRPC's backoff (1 s, 1.6 times longer after each failed attempt,
// ±20%) capped at MaxReconnectDelay, and its 20 s connect timeout, as
// lease.ConnectParams does for the regional service.
//
// Uncapped, the backoff grows to two minutes, so a client reached etcd
// again long after etcd was back: 10.5 s after a 30 s outage
// (BENCHMARKS.md, "etcd back: how soon the daemons see it"). Everything a
// region runs on after an etcd outage waits for that dial: its leader's
// session and election, its report to a global leader that needs its own
// election, and the etcd rule of the static lease (no global leader: the
// lease is extended). With the default region_lease of a minute, an outage
// of 40 s and a client that came back 20 s late put every region on its
// floor although etcd was back (docs/architecture.md, "The static
// lease"). An attempt a second costs etcd nothing.
var Reconnect = grpc.ConnectParams{
	Backoff: func() backoff.Config {
		b := backoff.DefaultConfig
		b.MaxDelay = MaxReconnectDelay
		return b
	}(),
	MinConnectTimeout: 20 * time.Second,
}

// DialOptions are the gRPC options of every etcd client a daemon makes
// (Reconnect).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithConnectParams(Reconnect)}
}

// Access is how a command authenticates to etcd. Every field is optional:
// CA enables TLS (Cert and Key then present a client certificate),
// Username and Password use etcd's own authentication.
type Access struct {
	CA, Cert, Key      string
	Username, Password string
}

// Register defines the access flags on fs.
func (a *Access) Register(fs *flag.FlagSet) {
	fs.StringVar(&a.CA, "etcd-ca", "", "CA bundle (PEM) to verify etcd with; enables TLS to etcd")
	fs.StringVar(&a.Cert, "etcd-cert", "", "client certificate (PEM) for etcd")
	fs.StringVar(&a.Key, "etcd-key", "", "client private key (PEM) for etcd")
	fs.StringVar(&a.Username, "etcd-username", "", "etcd user")
	fs.StringVar(&a.Password, "etcd-password", "", "etcd password")
}

// CheckEndpoints refuses an etcd endpoint the etcd client cannot dial,
// naming it: host:port, or a URL of scheme http, https, unix or unixs
// with a host (a path for unix). The etcd client takes anything and
// retries a malformed address until its dial timeout, which read as etcd
// being down.
func CheckEndpoints(endpoints []string) error {
	if len(endpoints) == 0 {
		return errors.New("no etcd endpoint given")
	}
	for _, e := range endpoints {
		if err := checkEndpoint(e); err != nil {
			return fmt.Errorf("etcd endpoint %q: %w", e, err)
		}
	}
	return nil
}

func checkEndpoint(e string) error {
	if !strings.Contains(e, "://") {
		host, port, err := net.SplitHostPort(e)
		if err != nil {
			return fmt.Errorf("want host:port or a URL (%v)", err)
		}
		if host == "" || port == "" {
			return errors.New("want host:port with both a host and a port")
		}
		return nil
	}
	u, err := url.Parse(e)
	if err != nil {
		return err
	}
	switch u.Scheme {
	case "http", "https":
		if u.Hostname() == "" {
			return errors.New("the URL names no host")
		}
	case "unix", "unixs":
		if u.Host == "" && u.Path == "" {
			return errors.New("the URL names no socket")
		}
	default:
		return fmt.Errorf("scheme %q: want http, https, unix or unixs", u.Scheme)
	}
	return nil
}

// Client connects to etcd at endpoints (at least one) with a's access.
// The caller closes it. A malformed endpoint is refused (CheckEndpoints).
func (a *Access) Client(endpoints []string) (*clientv3.Client, error) {
	if err := CheckEndpoints(endpoints); err != nil {
		return nil, err
	}
	tls, err := tlsconfig.Client(a.CA, a.Cert, a.Key, "")
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: DialTimeout, TLS: tls,
		Username: a.Username, Password: a.Password, Logger: zap.NewNop(),
		DialOptions: DialOptions(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil
}
