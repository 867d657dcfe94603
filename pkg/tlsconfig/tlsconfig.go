package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/sluicehq/sluice/internal/logthrottle"
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
	outside := newValidityLog(o.log)
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		cert := pair.get()
		if err := validAt(cert, certFile, time.Now()); err != nil {
			// Presented all the same: clients judge it, and say so.
			outside.note("tls: this server's certificate is outside its validity period; clients refuse it", err)
		}
		c.Certificates = []tls.Certificate{*cert}
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
		log := optionsOf(opts).log
		pair, err := watchKeyPair(log, certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tls client: %w", err)
		}
		cfg.Certificates = []tls.Certificate{*pair.get()}
		// Every handshake presents the files' current certificate, unless
		// it is outside its validity period: the server would refuse it
		// with an alert that, under TLS 1.3, reaches the client after its
		// first write, often as a broken pipe or a reset that says nothing
		// of the certificate. Failed here, the handshake's error names it.
		outside := newValidityLog(log)
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert := pair.get()
			if err := validAt(cert, certFile, time.Now()); err != nil {
				outside.note("tls: this client's certificate is outside its validity period; not presenting it", err)
				return nil, err
			}
			return cert, nil
		}
	}
	return cfg, nil
}

// ErrCertificateNotValid is wrapped by the handshake error of a client
// whose own certificate is outside its validity period (expired, or not
// yet valid), which Client's configuration does not present.
var ErrCertificateNotValid = errors.New("own certificate outside its validity period")

// validAt is an error wrapping ErrCertificateNotValid when cert's leaf
// (from file) is not valid at now.
func validAt(cert *tls.Certificate, file string, now time.Time) error {
	leaf := cert.Leaf
	if leaf == nil {
		if len(cert.Certificate) == 0 {
			return nil
		}
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil // X509KeyPair parsed it: cannot happen
		}
	}
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return fmt.Errorf("%w: %s is valid from %s until %s, and it is %s: renew it",
			ErrCertificateNotValid, file, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return nil
}

// validityEvery is how often, at most, a configuration logs that its
// certificate is outside its validity period: every handshake finds it.
const validityEvery = time.Minute

// validityLog logs a certificate outside its validity period at most once
// per validityEvery. Safe for concurrent use.
type validityLog struct {
	log     *slog.Logger
	spacing *logthrottle.Throttle
}

func newValidityLog(log *slog.Logger) *validityLog {
	return &validityLog{log: log, spacing: logthrottle.New(validityEvery)}
}

func (v *validityLog) note(msg string, err error) {
	if ok, _ := v.spacing.Allow("", time.Now()); ok {
		v.log.Error(msg, "err", err, "repeated_every", validityEvery)
	}
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
