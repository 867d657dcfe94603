package endpoint

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/logthrottle"
)

// Reasons a client certificate is refused in the TLS handshake, the
// reason label of sluice_rpc_handshake_refused_total.
const (
	RefusedNoCertificate    = "no_certificate"    // mutual TLS, none presented
	RefusedExpired          = "expired"           // expired or not yet valid
	RefusedUnknownAuthority = "unknown_authority" // not signed by the client CA
	RefusedInvalid          = "invalid"           // any other verification failure (key usage, ...)
	RefusedOther            = "other"             // no TLS client, a reset: not logged
)

// handshakeLogEvery is the least time between two log lines about one
// peer host and reason.
const handshakeLogEvery = time.Minute

// refusals counts and logs the handshakes a server's TLS refuses: such a
// client never reaches the gRPC interceptors, and sees only a TLS alert
// or a reset connection (Unavailable), so the server's log is where an
// operator learns whose certificate expired.
type refusals struct {
	log     *slog.Logger
	counter *prometheus.CounterVec
	now     func() time.Time
	logged  *logthrottle.Throttle // by host and reason
}

func newRefusals(log *slog.Logger, reg prometheus.Registerer) *refusals {
	r := &refusals{log: log, now: time.Now, logged: logthrottle.New(handshakeLogEvery)}
	r.counter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_rpc_handshake_refused_total",
		Help: "TLS handshakes the gRPC server refused, by reason: no_certificate, expired, unknown_authority, invalid (the client certificate), other (not a TLS client, a connection reset).",
	}, []string{"reason"})
	for _, l := range []string{RefusedNoCertificate, RefusedExpired, RefusedUnknownAuthority, RefusedInvalid, RefusedOther} {
		r.counter.WithLabelValues(l)
	}
	reg.MustRegister(r.counter)
	return r
}

// classify names why a server handshake failed and, for a certificate
// presented, says whose it is and why it was refused.
func classify(err error) (reason string, attrs []any) {
	var cve *tls.CertificateVerificationError
	if errors.As(err, &cve) {
		reason = RefusedInvalid
		var inv x509.CertificateInvalidError
		var unk x509.UnknownAuthorityError
		switch {
		case errors.As(cve.Err, &inv) && inv.Reason == x509.Expired:
			reason = RefusedExpired
		case errors.As(cve.Err, &unk):
			reason = RefusedUnknownAuthority
		}
		if len(cve.UnverifiedCertificates) > 0 {
			leaf := cve.UnverifiedCertificates[0]
			attrs = append(attrs, "identity", identity(leaf), "not_before", leaf.NotBefore.UTC(), "not_after", leaf.NotAfter.UTC(), "issuer", leaf.Issuer.String())
		}
		return reason, attrs
	}
	if strings.Contains(err.Error(), "didn't provide a certificate") {
		return RefusedNoCertificate, nil
	}
	return RefusedOther, nil
}

// identity is a certificate's name in logs, as rpcauth names callers: its
// first SAN URI, else its first DNS name, else its subject.
func identity(c *x509.Certificate) string {
	if len(c.URIs) > 0 {
		return c.URIs[0].String()
	}
	if len(c.DNSNames) > 0 {
		return c.DNSNames[0]
	}
	return c.Subject.String()
}

func (r *refusals) note(peer net.Addr, err error) {
	reason, attrs := classify(err)
	r.counter.WithLabelValues(reason).Inc()
	if reason == RefusedOther {
		return
	}
	host := ""
	if peer != nil {
		host = peer.String()
		if h, _, e := net.SplitHostPort(host); e == nil {
			host = h
		}
	}
	if log, _ := r.logged.Allow(host+" "+reason, r.now()); log {
		r.log.Warn("TLS handshake refused: the client's certificate is not accepted (further refusals of this peer for this reason are counted in sluice_rpc_handshake_refused_total, logged again after a minute)",
			append([]any{"peer", host, "reason", reason, "err", err.Error()}, attrs...)...)
	}
}

// observedCreds are server transport credentials that report refused
// handshakes to refusals.
type observedCreds struct {
	credentials.TransportCredentials
	r *refusals
}

func (c observedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	addr := raw.RemoteAddr()
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		c.r.note(addr, err)
	}
	return conn, info, err
}

func (c observedCreds) Clone() credentials.TransportCredentials {
	return observedCreds{TransportCredentials: c.TransportCredentials.Clone(), r: c.r}
}
