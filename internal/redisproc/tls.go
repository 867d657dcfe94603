package redisproc

import (
	"crypto/tls"
	"errors"
	"os/exec"
)

// StartTLS runs redis-server serving TLS only (--port 0 and --tls-port on
// a free port) with the server certificate and key in certFile and
// keyFile, requiring client certificates from the CA in caFile when
// clientAuth; more arguments follow. client is the configuration this
// package's own start-up check dials with (it trusts the CA and, with
// clientAuth, presents a client certificate). It needs redis-server built
// with TLS (Debian's is).
func StartTLS(client *tls.Config, certFile, keyFile, caFile string, clientAuth bool, args ...string) (*Proc, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNoRedisServer
	}
	if client == nil {
		return nil, errors.New("redisproc: StartTLS needs the client TLS configuration it checks the server with")
	}
	auth := "no"
	if clientAuth {
		auth = "yes"
	}
	extra := append([]string{"--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", auth}, args...)
	var err error
	for range portAttempts {
		var port int
		if port, err = freePort(); err != nil {
			return nil, err
		}
		p := &Proc{port: port, extra: extra, tls: client}
		if err = p.start(); err == nil {
			return p, nil
		}
		if !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
	return nil, err
}
