package lease

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// TestCertificateRefusedReadsTheAlert: a connection error carrying a TLS
// alert about the client's certificate is a refusal of its credentials,
// named by the alert; its own certificate outside its validity is one too.
// Anything else, among them the client failing to verify the server's
// certificate and alerts that are no verdict on a certificate, is not.
func TestCertificateRefusedReadsTheAlert(t *testing.T) {
	for msg, want := range map[string]string{
		`connection error: desc = "error reading server preface: remote error: tls: expired certificate"`:                                                             "expired certificate",
		`connection error: desc = "transport: authentication handshake failed: remote error: tls: bad certificate"`:                                                   "bad certificate",
		`remote error: tls: unknown certificate authority`:                                                                                                            "unknown certificate authority",
		`remote error: tls: unknown certificate`:                                                                                                                      "unknown certificate",
		`remote error: tls: certificate required`:                                                                                                                     "certificate required",
		`transport: authentication handshake failed: ` + tlsconfig.ErrCertificateNotValid.Error() + `: app.crt`:                                                       ownCertificateNotValid,
		`connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate has expired or is not yet valid"`: "",
		`remote error: tls: handshake failure`:                                                                                                                        "",
		`remote error: tls: protocol version not supported`:                                                                                                           "",
		`write tcp 127.0.0.1:1->127.0.0.1:2: write: broken pipe`:                                                                                                      "",
		`remote error: tls: expired certificatex`:                                                                                                                     "",
	} {
		if got := certificateRefused(status.Error(codes.Unavailable, msg)); got != want {
			t.Errorf("%q: %q, want %q", msg, got, want)
		}
	}
	for _, err := range []error{nil, errors.New("remote error: tls: bad certificate"),
		status.Error(codes.Internal, "remote error: tls: bad certificate")} {
		if got := certificateRefused(err); got != "" {
			t.Errorf("%v: %q, want none (not an Unavailable connection error)", err, got)
		}
	}
}
