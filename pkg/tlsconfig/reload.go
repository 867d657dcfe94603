package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"sync"
	"time"
)

// ReloadInterval is how often, at most, a configuration looks at its
// certificate, key and client CA files again: a handshake after a file
// changed uses the new contents within this long.
var ReloadInterval = 5 * time.Second

// files holds what a configuration last loaded from its files and loads
// them again when their contents change. A set that does not load (a
// rotation caught half-written: a new certificate beside the old key) is
// logged and the last good one kept; the next look tries again.
type files[T any] struct {
	names []string
	load  func() (T, error)
	what  string // "certificate", "client CA" in logs
	log   *slog.Logger

	mu      sync.Mutex
	current T
	raw     [][]byte // the files' contents current was loaded from
	checked time.Time
	failed  [][]byte // contents that last failed to load (logged once)
}

func newFiles[T any](log *slog.Logger, what string, load func() (T, error), names ...string) (*files[T], error) {
	raw, err := readAll(names)
	if err != nil {
		return nil, err
	}
	v, err := load()
	if err != nil {
		return nil, err
	}
	return &files[T]{names: names, load: load, what: what, log: log, current: v, raw: raw, checked: time.Now()}, nil
}

func readAll(names []string) ([][]byte, error) {
	out := make([][]byte, len(names))
	for i, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

func same(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// get returns the current value, first loading the files again when
// ReloadInterval has passed since the last look and they changed.
func (f *files[T]) get() T {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if now.Sub(f.checked) < ReloadInterval {
		return f.current
	}
	f.checked = now
	raw, err := readAll(f.names)
	if err != nil || same(raw, f.raw) || same(raw, f.failed) {
		return f.current
	}
	v, err := f.load()
	if err != nil {
		f.failed = raw
		f.log.Error("tls: the "+f.what+" files changed but do not load; keeping the ones loaded before", "files", f.names, "err", err)
		return f.current
	}
	f.current, f.raw, f.failed = v, raw, nil
	f.log.Info("tls: loaded the changed "+f.what+" files; new connections use them", "files", f.names)
	return v
}

func watchKeyPair(log *slog.Logger, certFile, keyFile string) (*files[*tls.Certificate], error) {
	return newFiles(log, "certificate", func() (*tls.Certificate, error) {
		c, err := loadKeyPair(certFile, keyFile)
		return &c, err
	}, certFile, keyFile)
}

func watchPool(log *slog.Logger, file string) (*files[*x509.CertPool], error) {
	return newFiles(log, "CA", func() (*x509.CertPool, error) { return loadPool(file) }, file)
}

// Option changes how Server and Client load their files.
type Option func(*options)

type options struct{ log *slog.Logger }

// WithLogger logs reloads of the certificate files (a rotation taken, or
// files that changed but do not load) to log; without it they go to
// slog.Default().
func WithLogger(log *slog.Logger) Option { return func(o *options) { o.log = log } }

func optionsOf(opts []Option) options {
	o := options{log: slog.Default()}
	for _, f := range opts {
		f(&o)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	return o
}
