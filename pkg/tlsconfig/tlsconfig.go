package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// MinVersion is the oldest TLS version accepted either way.
const MinVersion = tls.VersionTLS12

// Server returns a server configuration presenting the certificate in
// certFile with its private key in keyFile (PEM). When clientCAFile is set,
// clients must present a certificate signed by one of the CAs in it
// (mutual TLS). All three empty means no TLS: (nil, nil). A client CA
// without a server certificate, or a certificate without its key, is an
// error.
func Server(certFile, keyFile, clientCAFile string, opts ...Option) (*tls.Config, error) {
	if certFile == "" && keyFile == "" && clientCAFile == "" {
		return nil, nil
	}
	if certFile == "" || keyFile == "" {
		return nil, fmt.Errorf("tls server: a certificate file and a key file are both required (certificate %q, key %q)", certFile, keyFile)
	}
	o := optionsOf(opts)
	pair, err := watchKeyPair(o.log, certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls server: %w", err)
	}
	cfg := &tls.Config{MinVersion: MinVersion, Certificates: []tls.Certificate{*pair.get()}}
	var pool *files[*x509.CertPool]
	if clientCAFile != "" {
		if pool, err = watchPool(o.log, clientCAFile); err != nil {
			return nil, fmt.Errorf("tls server: client CA: %w", err)
		}
		cfg.ClientCAs = pool.get()
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	// Every handshake takes the files' current contents (ReloadInterval).
	base := cfg.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.Certificates = []tls.Certificate{*pair.get()}
		if pool != nil {
			c.ClientCAs = pool.get()
		}
		return c, nil
	}
	return cfg, nil
}

// Client returns a client configuration that trusts the CAs in caFile
// (the system roots when empty), presents the certificate in certFile
// with its key in keyFile when set (for mutual TLS), and expects the
// server to be named serverName (the dialed host when empty). Everything
// empty means no TLS: (nil, nil); only a serverName means TLS with the
// system roots. A certificate without its key is an error.
func Client(caFile, certFile, keyFile, serverName string, opts ...Option) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" && serverName == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: MinVersion, ServerName: serverName}
	if caFile != "" {
		pool, err := loadPool(caFile)
		if err != nil {
			return nil, fmt.Errorf("tls client: CA: %w", err)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		if certFile == "" || keyFile == "" {
			return nil, fmt.Errorf("tls client: a client certificate needs both files (certificate %q, key %q)", certFile, keyFile)
		}
		pair, err := watchKeyPair(optionsOf(opts).log, certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tls client: %w", err)
		}
		cfg.Certificates = []tls.Certificate{*pair.get()}
		// Every handshake presents the files' current certificate.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return pair.get(), nil
		}
	}
	return cfg, nil
}

func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("read certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("read key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certificate %s with key %s: %w", certFile, keyFile, err)
	}
	return cert, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("no PEM certificate found in " + file)
	}
	return pool, nil
}
