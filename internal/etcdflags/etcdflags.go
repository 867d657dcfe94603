// Package etcdflags holds the etcd access flags the daemons share
// (-etcd-ca, -etcd-cert, -etcd-key, -etcd-username, -etcd-password) and
// makes the client from them, so every command reaches etcd the same way.
package etcdflags

import (
	"flag"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// DialTimeout bounds connecting to etcd.
const DialTimeout = 10 * time.Second

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

// Client connects to etcd at endpoints (at least one) with a's access.
// The caller closes it.
func (a *Access) Client(endpoints []string) (*clientv3.Client, error) {
	tls, err := tlsconfig.Client(a.CA, a.Cert, a.Key, "")
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: DialTimeout, TLS: tls,
		Username: a.Username, Password: a.Password, Logger: zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	return cli, nil
}
