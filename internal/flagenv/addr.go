package flagenv

import (
	"errors"
	"net"
	"net/url"

	"google.golang.org/grpc/resolver"
)

// HostPort says why addr is not host:port, nil when it is: the check of
// every address flag, made before anything is dialed or announced, in
// net's words ("missing port in address", "too many colons in address").
// A port left empty ("host:") is not one: gRPC dials it on port 443 and
// Redis on 6379, where nothing of the deployment listens, and the mistake
// showed only as a service that never answered. A host left empty
// (":7400") is the local host. Empty is refused.
func HostPort(addr string) error {
	if addr == "" {
		return errors.New("it is empty")
	}
	_, port, err := net.SplitHostPort(addr)
	var ae *net.AddrError
	switch {
	case errors.As(err, &ae):
		return errors.New(ae.Err)
	case err != nil:
		return err
	case port == "":
		return errors.New("missing port")
	}
	return nil
}

// GRPCTarget says why target is neither host:port (HostPort) nor a
// target of a registered gRPC resolver scheme (dns:///host:port), nil
// when it is one. Anything else gRPC takes as a host name to resolve, and
// fails as if the service were down.
func GRPCTarget(target string) error {
	if u, err := url.Parse(target); err == nil && u.Scheme != "" && resolver.Get(u.Scheme) != nil {
		return nil
	}
	return HostPort(target)
}
