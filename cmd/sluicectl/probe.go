package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/flagenv"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/lease"
	"github.com/sluicehq/sluice/pkg/quota"
	"github.com/sluicehq/sluice/pkg/regional/rpcerr"
)

// leaseCmd takes one lease from a regional service and prints the grant:
// the quickest way to see a region answer (and the example call dev mode
// prints). It releases the lease again unless -keep is given.
func (a *app) leaseCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	addr := fs.String("addr", "127.0.0.1:7400", "regional service host:port")
	tenant := fs.String("tenant", "", "tenant id (required)")
	class := fs.String("class", "read", "route class")
	want := fs.Int64("want", 10, fmt.Sprintf("tokens to lease (1..%d)", quota.MaxWant))
	instance := fs.String("instance", "", "instance id (default sluicectl-<pid>)")
	keep := fs.Bool("keep", false, "keep the lease instead of releasing it (it expires after the lease TTL)")
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 || *tenant == "" {
			return exitf(exitUsage, "lease needs -tenant and takes no arguments")
		}
		if err := a.regionalFlags(*addr); err != nil {
			return err
		}
		if *want < 1 || *want > quota.MaxWant {
			return exitf(exitUsage, "-want %d is out of range: a lease asks for 1..%d tokens", *want, quota.MaxWant)
		}
		id := *instance
		if id == "" {
			id = "sluicectl-" + strconv.Itoa(os.Getpid())
		}
		conn, err := a.dialGRPC(*addr, "")
		if err != nil {
			return err
		}
		defer conn.Close()
		c := sluicev1.NewLeaseServiceClient(conn)
		stepCtx, cancel := a.step(ctx)
		defer cancel()
		key := &sluicev1.QuotaKey{Tenant: *tenant, Class: *class}
		resp, err := c.Acquire(stepCtx, &sluicev1.AcquireRequest{InstanceId: id,
			Report: &sluicev1.KeyReport{Key: key, Seq: 1, Want: *want, Min: 1}})
		if err != nil {
			return a.rpcFailure(ctx, "acquire", *addr, *class, err)
		}
		g := resp.GetGrant()
		if g.GetMode() == string(config.ModeStrict) {
			return exitf(exitInvalid, "class %q is strict: it grants no leases, every request is decided in the region's Redis; use: sluicectl check -addr %s -tenant %s -class %s",
				*class, *addr, *tenant, *class)
		}
		fmt.Fprintf(a.stdout, "granted %d of %d tokens for %s/%s (lease valid %dms; region refills at %.6g/s, burst cap %.6g; %d tokens left in the bucket; limit %d; mode %s, on_failure %s, tier %s)\n",
			g.GetGranted(), *want, *tenant, *class, g.GetTtlMs(), g.GetRegionRate(), g.GetRegionBurst(), g.GetRemaining(),
			g.GetLimit(), g.GetMode(), g.GetOnFailure(), g.GetTier())
		switch {
		case g.GetGranted() == 0 && g.GetRetryAfterMs() > 0:
			fmt.Fprintf(a.stdout, "bucket empty: retry after %dms\n", g.GetRetryAfterMs())
		case g.GetGranted() == 0 && g.GetRetryAfterMs() < 0:
			// The request's min is 1: the region's "never" is about one token.
			fmt.Fprintln(a.stdout, regionNever(1, g.GetLimit(), g.GetUnleased(), g.GetRegionRate(), g.GetRegionBurst(), true))
		}
		if *keep || g.GetGranted() == 0 {
			return nil
		}
		rel, err := c.Release(stepCtx, &sluicev1.ReleaseRequest{InstanceId: id,
			Reports: []*sluicev1.KeyReport{{Key: key, Seq: 2, Returned: g.GetGranted()}}})
		if err != nil {
			return a.rpcFailure(ctx, "release", *addr, *class, err)
		}
		fmt.Fprintf(a.stdout, "released: %d tokens back in the bucket\n", rel.GetReturned())
		return nil
	}
}

// checkCmd makes one strict, cost-weighted decision. A denial exits with
// exitDenied, so scripts can tell it from success and from failures.
func (a *app) checkCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	addr := fs.String("addr", "127.0.0.1:7400", "regional service host:port")
	tenant := fs.String("tenant", "", "tenant id (required)")
	class := fs.String("class", "export", "route class")
	cost := fs.Int64("cost", 1, fmt.Sprintf("tokens the request costs (1..%d)", quota.MaxCost))
	return func(ctx context.Context, args []string) error {
		if len(args) > 0 || *tenant == "" {
			return exitf(exitUsage, "check needs -tenant and takes no arguments")
		}
		if err := a.regionalFlags(*addr); err != nil {
			return err
		}
		if *cost < 1 || *cost > quota.MaxCost {
			return exitf(exitUsage, "-cost %d is out of range: a request costs 1..%d tokens", *cost, quota.MaxCost)
		}
		conn, err := a.dialGRPC(*addr, "")
		if err != nil {
			return err
		}
		defer conn.Close()
		stepCtx, cancel := a.step(ctx)
		defer cancel()
		resp, err := sluicev1.NewLeaseServiceClient(conn).Check(stepCtx, &sluicev1.CheckRequest{
			Key: &sluicev1.QuotaKey{Tenant: *tenant, Class: *class}, Cost: *cost})
		if err != nil {
			return a.rpcFailure(ctx, "check", *addr, *class, err)
		}
		verdict := "allowed"
		switch {
		case resp.GetAllowed():
		case resp.GetRetryAfterMs() < 0:
			verdict = "denied (" + regionNever(*cost, resp.GetLimit(), resp.GetUnleased(), resp.GetRegionRate(), resp.GetRegionBurst(),
				resp.RegionRate != nil && resp.RegionBurst != nil) + ")"
		default:
			verdict = fmt.Sprintf("denied (retry after %dms)", resp.GetRetryAfterMs())
		}
		fmt.Fprintf(a.stdout, "%s: %s/%s cost %d; limit %d, remaining %d, full again in %dms\n",
			verdict, *tenant, *class, *cost, resp.GetLimit(), resp.GetRemaining(), resp.GetResetMs())
		if !resp.GetAllowed() {
			return &exitError{code: exitDenied}
		}
		return nil
	}
}

// regionalFlags refuses, as usage errors before anything is dialed, an
// -addr that is not host:port (flagenv.HostPort: gRPC would take the text as a
// name to resolve and fail as if the service were down) and a -timeout
// that is not positive.
func (a *app) regionalFlags(addr string) error {
	if err := flagenv.HostPort(addr); err != nil {
		return exitf(exitUsage, "-addr %q is not host:port (%v); give the regional service's address, as 127.0.0.1:7400", addr, err)
	}
	return a.positiveTimeout()
}

// regionNever says in words what a region's "never" (retry_after_ms -1:
// its bucket cannot hold n tokens at its current cap less the tokens out
// in leases, or its rate is zero) means for a request of n tokens, as the
// lease client reads it (lease.WaitCures; docs/architecture.md, "No
// edge promises a wait that cannot be honoured"). Only a cost above the
// key's configured burst, or above the cap of a region run with no global
// tier (-unleased), whose rate and cap are its static share for good, is
// past any wait. A region with a global tier gets more without a config
// change: leases come back, grants raise its cap up to the burst, and a
// rate of 0 (its floor while drained or holding no static lease, or a
// class whose share awaits the global tier's confirmation) comes back, so
// instances ask again after a refresh. known is false for an answer
// without the region's rate and cap (a server that predates them).
func regionNever(n, limit int64, unleased bool, rate, burst float64, known bool) string {
	switch {
	case limit > 0 && n > limit:
		return fmt.Sprintf("no wait helps: %s is more than the key's configured burst, %d", tokens(n), limit)
	case !known:
		return "the region's bucket cannot hold it now, at its cap less the tokens out in leases"
	case unleased && !lease.WaitCures(n, limit, unleased, known, rate, burst):
		return fmt.Sprintf("no wait helps: the region runs with no global tier, so its cap for this key (%.6g) and its rate (%.6g/s) stay as they are until the config changes, and its bucket cannot hold %s", burst, rate, tokens(n))
	case unleased:
		return fmt.Sprintf("the region's bucket cannot hold %s now: tokens are out in leases (its cap is %.6g); they come back as leases are released or expire, so a client asks again after a refresh", tokens(n), burst)
	case rate <= 0:
		return "the region's rate for this key is 0 now: it runs on its floor at partition_share 0 (drained, or holding no static lease: the global tier has not answered it yet, or its lease lapsed; a region with no global tier at all needs -unleased), or the key's class awaits the global tier's confirmation; a restore, the global tier's answer or the confirmation gives it back, so a client asks again after a refresh"
	}
	return fmt.Sprintf("the region's bucket cannot hold %s now: its cap for this key is %.6g, less the tokens out in leases; leases come back and the global tier grants the region more of the key's burst, so a client asks again after a refresh", tokens(n), burst)
}

func tokens(n int64) string {
	if n == 1 {
		return "1 token"
	}
	return strconv.FormatInt(n, 10) + " tokens"
}

// rpcFailure maps a regional RPC error to an exit code: SIGINT or SIGTERM
// (ctx done) is 130, an unknown class 4, other bad input 1, credentials
// the service refused 7, and everything else means the service could not
// answer (5). A service that closed a plaintext connection unanswered is
// refused too (7): see plaintextRefused.
func (a *app) rpcFailure(ctx context.Context, what, addr, class string, err error) error {
	if ctx.Err() != nil {
		return interrupted(ctx, what+" via "+addr)
	}
	if why, ok := a.transportRefusal(err); ok {
		return exitf(exitRefused, "%s via %s: %s", what, addr, why)
	}
	st := status.Convert(err)
	switch st.Code() {
	case codes.InvalidArgument:
		if strings.Contains(st.Message(), fmt.Sprintf("class %q is not configured", class)) {
			return exitf(exitNotFound, "%s refused: %s", what, st.Message())
		}
		return exitf(exitInvalid, "%s refused: %s", what, st.Message())
	case codes.PermissionDenied, codes.Unauthenticated:
		return refusedFailure(what, addr, st)
	case codes.FailedPrecondition:
		// The service answered: its region is not in the config it runs
		// (removed), so it has nothing to decide with.
		return exitf(exitNotFound, "%s refused: %s", what, st.Message())
	}
	if rpcerr.RedisFailed(err) {
		// The service answered: it is its Redis that failed the call.
		return exitf(exitUnreachable, "%s via %s failed: the regional service answered, but its Redis failed the call: %s (see docs/operations.md, \"Regional Redis down\")", what, addr, st.Message())
	}
	return exitf(exitUnreachable, "%s via %s failed: %s (is the regional service running there?)", what, addr, st.Message())
}

// plaintextRefusal says what to do about a service that closed a
// plaintext connection before speaking gRPC.
const plaintextRefusal = "the service closed the connection without answering, as a TLS listener does with a client that speaks plaintext\n" +
	"give -tls-ca (and -tls-cert/-tls-key where the service requires client certificates)"

// plaintextRefused reports whether err is a connection that the service
// closed before speaking HTTP/2 while this client dialed without TLS (no
// -tls-ca). A TLS listener does that with a plaintext client: the service
// is up and the flags are missing, so reporting it as unreachable (and a
// global failover as the likely cause) would send the operator the wrong
// way.
func (a *app) plaintextRefused(err error) bool {
	return a.g.tlsCA == "" && strings.Contains(status.Convert(err).Message(), "error reading server preface")
}

// transportRefusal says what to do when err is a connection the service
// dropped for want of this client's TLS (plaintextRefused,
// clientCertMissing): a refusal (exit 7), not an outage.
func (a *app) transportRefusal(err error) (string, bool) {
	switch {
	case a.plaintextRefused(err):
		return plaintextRefusal, true
	case a.clientCertMissing(err):
		return clientCertRefusal, true
	}
	return "", false
}

// clientCertRefusal says what to do about a service that asked for a
// client certificate this run had none of.
const clientCertRefusal = "the service asked for a client certificate in the TLS handshake and this client had none to give, so the connection failed (mutual TLS)\n" +
	"give -tls-cert and -tls-key: a certificate of the service's CA holding a role that may call it (the auth section of the config)"

// clientCertMissing reports whether err is a connection that failed after
// a service asked for a client certificate while no -tls-cert was given.
// A service requiring one (tlsconfig.Server with a client CA) completes
// the handshake and then drops the connection, which reads as a broken
// pipe, a reset or "tls: certificate required" depending on timing, so
// the request for the certificate, recorded during the handshake, is what
// tells this case from a service that is down. Answers (PermissionDenied,
// Unauthenticated) are not transport failures and are left to the caller.
func (a *app) clientCertMissing(err error) bool {
	return a.g.tlsCert == "" && a.certAsked.Load() && status.Code(err) == codes.Unavailable
}

// refusedFailure is a service that answered but refused the caller's
// credentials: the client certificate (-tls-cert) is missing, or holds no
// role the method needs.
func refusedFailure(what, addr string, st *status.Status) error {
	return exitf(exitRefused, "%s via %s: the service refused this client (%s): %s\n"+
		"check that -tls-cert/-tls-key are given and hold a role that may call it (the auth section of the config)",
		what, addr, st.Code(), st.Message())
}
