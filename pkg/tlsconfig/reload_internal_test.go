package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestHalfWrittenRotationKeepsTheLastGoodPair: a certificate written
// before its key (the two files do not match) is not taken; the pair
// loaded before stays in use until both files are replaced.
func TestHalfWrittenRotationKeepsTheLastGoodPair(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	ca, err := NewCA("ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, l Leaf) (certFile, keyFile string) {
		certPEM, keyPEM, err := ca.Issue(l, now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		return certFile, keyFile
	}
	serial := func(f *files[*tls.Certificate]) string {
		leaf, err := x509.ParseCertificate(f.get().Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.SerialNumber.String()
	}
	certFile, keyFile := write("svc", Leaf{Name: "svc", Server: true})
	f, err := watchKeyPair(slog.New(slog.DiscardHandler), certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	first := serial(f)

	newCert, _ := write("next", Leaf{Name: "svc", Server: true})
	b, err := os.ReadFile(newCert)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f.checked = time.Time{} // look at the files now
	if got := serial(f); got != first {
		t.Fatalf("a certificate beside the old key was taken: serial %s, want the last good %s", got, first)
	}
	b, err = os.ReadFile(filepath.Join(dir, "next.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f.checked = time.Time{}
	if got := serial(f); got == first {
		t.Fatal("the pair was not taken once its key was written too")
	}
}
