package tlsconfig

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that issues the certificates of a Sluice
// deployment's mutual TLS (sluicectl certs): a self-signed ECDSA P-256 CA.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

// Leaf describes a certificate to issue. Its SAN URIs and DNS names are
// the identities auth.identities gives roles.
type Leaf struct {
	// Name is the file name stem: <Name>.crt and <Name>.key.
	Name string
	// URIs and DNSNames are the SANs (identities, and for a server the
	// names clients dial); IPs are IP SANs for servers.
	URIs     []string
	DNSNames []string
	IPs      []net.IP
	// Server and Client set the extended key usages.
	Server, Client bool
}

// NewCA creates a CA named name valid from now for validity.
func NewCA(name string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// LoadCA reads a CA written by WriteCA.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%s or %s holds no PEM block", certFile, keyFile)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certFile, err)
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", certFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: not a signing key", keyFile)
	}
	return &CA{cert: cert, key: signer, pem: certPEM}, nil
}

// CertPEM is the CA certificate (the -tls-ca and -tls-client-ca bundle).
func (ca *CA) CertPEM() []byte { return ca.pem }

// Issue signs a certificate for l valid from now for validity and returns
// it and its new private key (PKCS #8), both PEM.
func (ca *CA) Issue(l Leaf, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if !l.Server && !l.Client {
		return nil, nil, errors.New("tlsconfig: a certificate needs Server or Client usage")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: l.Name},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature,
		DNSNames: l.DNSNames, IPAddresses: l.IPs,
	}
	for _, u := range l.URIs {
		parsed, err := url.Parse(u)
		if err != nil || parsed.Scheme == "" {
			return nil, nil, fmt.Errorf("tlsconfig: SAN URI %q is not an absolute URI", u)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	if l.Server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if l.Client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// Pool is a certificate pool holding only the CA: what a peer verifies
// the leaves it issued against.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// IssueCertificate is Issue as a tls.Certificate, for a process that
// serves or dials with the leaf itself instead of writing it to files.
func (ca *CA) IssueCertificate(l Leaf, now time.Time, validity time.Duration) (tls.Certificate, error) {
	certPEM, keyPEM, err := ca.Issue(l, now, validity)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}

// WriteCA writes ca.crt and ca.key (mode 0600) into dir.
func (ca *CA) WriteCA(dir string) error {
	kder, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.pem, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "ca.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
}

// WriteLeaf issues l and writes <Name>.crt and <Name>.key (mode 0600)
// into dir.
func (ca *CA) WriteLeaf(dir string, l Leaf, now time.Time, validity time.Duration) error {
	c, k, err := ca.Issue(l, now, validity)
	if err != nil {
		return fmt.Errorf("%s: %w", l.Name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, l.Name+".crt"), c, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, l.Name+".key"), k, 0o600)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}
