package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/etcdflags"
	"github.com/sluicehq/sluice/internal/flagenv"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/tlsconfig"
)

// Exit codes, documented in the package comment and the usage text.
const (
	exitOK          = 0
	exitInvalid     = 1
	exitUsage       = 2
	exitConflict    = 3
	exitNotFound    = 4
	exitUnreachable = 5
	exitDenied      = 6
	exitRefused     = 7
	// exitInterrupted is 128 + SIGINT, as shells report it.
	exitInterrupted = 130
)

// envPrefix names the environment variables of global flags.
const envPrefix = "SLUICE"

const usageText = `usage: sluicectl [global flags] <command> [flags] [args]

commands:
  validate -f FILE                  check a config file offline ("-f -" reads stdin)
  apply -f FILE [-yes] [-dry-run] [-takeover]
                                    validate, show the diff against etcd, write it
  get [-o yaml|json]                print the config in etcd (its revision on stderr)
  status [-top N] [-o text|json]    leaders from etcd and the global allocation
  tenant get NAME                   a tenant's tier, overrides, shadow and limits
                                    (one not listed: exit 4, default_tier's shown)
  tenant set NAME [-tier T] [-shadow=true|false] [-override class=rate,burst ...]
                 [-remove-override class ...] [-yes] [-dry-run]
  tenant delete NAME [-yes] [-dry-run]
                                    stop listing a tenant (it gets default_tier)
  tenant list [-prefix P] [-limit N]
                                    stored tenants, one per line
  shadow set (class NAME | tenant NAME) on|off [-yes] [-dry-run]
  region drain NAME [-yes] [-dry-run]
                                    run the region on its floor and give its share
                                    to the other regions (regions.NAME.drained)
  region restore NAME [-yes] [-dry-run]
                                    undo a drain: the region's share comes back
  lease -addr HOST:PORT -tenant T [-class C] [-want N] [-keep]
                                    take (and release) one lease from a regional service
  check -addr HOST:PORT -tenant T [-class C] [-cost N]
                                    one strict decision from a regional service
  certs -dir DIR [-domain D] [-regions R1,R2] [-server-names N1,N2] [-validity D]
                                    write a CA, the daemons' and clients' mutual
                                    TLS certificates and the auth section giving
                                    them their roles (offline)
  import envoy-ratelimit DIR [-yes] [-dry-run] [-o FILE|- -base FILE]
                                    turn envoyproxy/ratelimit config files into
                                    envoy.domains trees and classes (etcd, or a file)

Changes (apply, tenant set, shadow set, region drain/restore, import) are
validated, shown as a diff and written in one etcd transaction guarded by
the revision they were computed from. Without -yes they ask "apply? [y/N]"
on a terminal and refuse otherwise.

exit codes:
  0  success (including "no changes")
  1  invalid input or config, or a change declined at the prompt
  2  usage error, found before anything is asked or written: an address
     that is not host:port, a number out of its range (-want, -cost, -top,
     -limit, a -timeout not above 0); a change without -yes when stdin is
     not a terminal, too
  3  conflict: the config in etcd changed between read and write
  4  not found: no config in etcd, or no such tenant, class or region
  5  unreachable: etcd, the global allocator or the regional service could
     not be reached; a change whose write got no answer may have been
     written all the same (it says so: check with sluicectl get)
  6  denied: check answered over quota (a result, not a failure)
  7  refused: the service answered but refused this client's credentials
     (no client certificate, or none holding a role that may call it),
     closed a connection made without -tls-ca, as a TLS listener does, or
     asked for the client certificate -tls-cert/-tls-key did not give
  130 interrupted by SIGINT or SIGTERM: nothing was written, except by an
     apply stopped while writing tenants in batches, which the daemons do
     not see until the same apply is run again with -takeover, and by a
     change stopped while waiting for its write's answer, which may have
     been written (it says so: check with sluicectl get)

global flags (also accepted after the command; each also read from the
environment variable named beside it, the command line wins):
`

// app is one invocation of the CLI. Not safe for concurrent use.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// getenv reads the environment for global flags left off the command line.
	getenv func(string) string
	// stdinIsTerminal says whether a confirmation can be asked on stdin.
	stdinIsTerminal func() bool
	// beforeWrite, when set, runs after a change was read, diffed and
	// confirmed and just before it is written; tests use it to change etcd
	// in between.
	beforeWrite func()

	// certAsked is set when a service asked, in a TLS handshake, for the
	// client certificate this run was given none of (see
	// clientCertMissing).
	certAsked atomic.Bool

	g globalFlags
}

// globalFlags are the flags every command accepts.
type globalFlags struct {
	// etcdEndpoints is a comma-separated list of host:port or URLs.
	// Required by every command but validate.
	etcdEndpoints string
	// etcdPrefix is the key prefix of the config and elections. Optional,
	// default "/sluice".
	etcdPrefix string
	// globalAddr is host:port of global allocator replicas, comma
	// separated as cmd/regional takes them (globalAddrs), for status.
	// Optional; default the global leader's address found in etcd.
	globalAddr string
	// timeout bounds each etcd or gRPC step. Optional, default 10s.
	timeout time.Duration
	// etcdCA, etcdCert, etcdKey are PEM files for TLS to etcd. Optional;
	// setting any of them turns TLS on. Cert and key go together.
	etcdCA, etcdCert, etcdKey string
	// etcdUsername and etcdPassword authenticate to etcd. Optional.
	etcdUsername, etcdPassword string
	// tlsCA, tlsCert, tlsKey are PEM files for TLS to the global tier.
	// Optional; setting any of them turns TLS on. Cert and key go together.
	tlsCA, tlsCert, tlsKey string
	// globalTLSName is the name the global tier's certificate must carry.
	// Optional; default the dialed host. Set it when etcd names the leader
	// by an IP its certificate lacks (-advertise=$(POD_IP):7500).
	globalTLSName string
}

func defaultGlobalFlags() globalFlags {
	return globalFlags{etcdPrefix: config.DefaultPrefix, timeout: 10 * time.Second}
}

// register binds the global flags to fs with their current values as
// defaults, so registering on a second flag set keeps what the first parsed.
func (g *globalFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.etcdEndpoints, "etcd-endpoints", g.etcdEndpoints, "etcd endpoints, comma separated (host:port or URL)")
	fs.StringVar(&g.etcdPrefix, "etcd-prefix", g.etcdPrefix, "etcd key prefix of the config and leader elections")
	fs.StringVar(&g.globalAddr, "global-addr", g.globalAddr, "host:port of global allocator replicas, comma separated (as cmd/regional's -global-addr), asked in turn for status until one answers (default: the global leader found in etcd)")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "time limit of each etcd or gRPC step")
	fs.StringVar(&g.etcdCA, "etcd-ca", g.etcdCA, "CA certificate (PEM) to verify etcd; turns on TLS to etcd")
	fs.StringVar(&g.etcdCert, "etcd-cert", g.etcdCert, "client certificate (PEM) for etcd; needs -etcd-key")
	fs.StringVar(&g.etcdKey, "etcd-key", g.etcdKey, "client key (PEM) for etcd; needs -etcd-cert")
	fs.StringVar(&g.etcdUsername, "etcd-username", g.etcdUsername, "etcd user name")
	fs.StringVar(&g.etcdPassword, "etcd-password", g.etcdPassword, "etcd password (prefer the environment variable)")
	fs.StringVar(&g.tlsCA, "tls-ca", g.tlsCA, "CA certificate (PEM) to verify the global allocator; turns on TLS")
	fs.StringVar(&g.tlsCert, "tls-cert", g.tlsCert, "client certificate (PEM) for the global allocator; needs -tls-key")
	fs.StringVar(&g.tlsKey, "tls-key", g.tlsKey, "client key (PEM) for the global allocator; needs -tls-cert")
	fs.StringVar(&g.globalTLSName, "global-tls-name", g.globalTLSName, "name the global tier's certificate must carry (default: the dialed host; set it when the leader's address is an IP, as -advertise=$(POD_IP):7500 makes it)")
}

// exitError ends a command with an exit code and a message for stderr.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func exitf(code int, format string, args ...any) error {
	return &exitError{code: code, msg: fmt.Sprintf(format, args...)}
}

// command is one subcommand. flags registers its flags on fs and returns
// the function that runs it with the positional arguments.
type command struct {
	name  string
	usage string
	flags func(fs *flag.FlagSet) func(ctx context.Context, args []string) error
}

func (a *app) commands() []command {
	return []command{
		{"validate", "validate -f FILE", a.validateCmd},
		{"apply", "apply -f FILE [-yes] [-dry-run] [-takeover]", a.applyCmd},
		{"get", "get [-o yaml|json]", a.getCmd},
		{"status", "status [-top N] [-o text|json]", a.statusCmd},
		{"tenant get", "tenant get NAME", a.tenantGetCmd},
		{"tenant set", "tenant set NAME [-tier T] [-shadow=true|false] [-override class=rate,burst ...] [-remove-override class ...] [-yes] [-dry-run]", a.tenantSetCmd},
		{"tenant delete", "tenant delete NAME [-yes] [-dry-run]", a.tenantDeleteCmd},
		{"tenant list", "tenant list [-prefix P] [-limit N]", a.tenantListCmd},
		{"shadow set", "shadow set (class NAME | tenant NAME) on|off [-yes] [-dry-run]", a.shadowSetCmd},
		{"region drain", "region drain NAME [-yes] [-dry-run]", a.regionDrainCmd},
		{"region restore", "region restore NAME [-yes] [-dry-run]", a.regionRestoreCmd},
		{"lease", "lease -addr HOST:PORT -tenant T [-class C] [-want N] [-keep]", a.leaseCmd},
		{"check", "check -addr HOST:PORT -tenant T [-class C] [-cost N]", a.checkCmd},
		{"certs", "certs -dir DIR [-domain D] [-regions R1,R2] [-server-names N1,N2] [-validity D]", a.certsCmd},
		{"import envoy-ratelimit", "import envoy-ratelimit DIR [-yes] [-dry-run] [-o FILE|- -base FILE]", a.importEnvoyCmd},
	}
}

func (a *app) run(ctx context.Context, args []string) int {
	err := a.dispatch(ctx, args)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		ee = &exitError{code: exitInvalid, msg: err.Error()}
	}
	if ee.msg != "" {
		fmt.Fprintln(a.stderr, "sluicectl: "+ee.msg)
	}
	return ee.code
}

func (a *app) dispatch(ctx context.Context, args []string) error {
	a.g = defaultGlobalFlags()
	top := flag.NewFlagSet("sluicectl", flag.ContinueOnError)
	top.SetOutput(a.stderr)
	a.g.register(top)
	flagenv.Usage(top, envPrefix)
	top.Usage = func() {
		fmt.Fprint(a.stderr, usageText)
		top.PrintDefaults()
	}
	if err := top.Parse(args); err != nil {
		return usageFailure(err)
	}
	rest := top.Args()
	if len(rest) == 0 {
		top.Usage()
		return exitf(exitUsage, "no command given; see the usage above")
	}
	if rest[0] == "help" {
		top.Usage()
		return nil
	}
	if group := a.group(rest[0]); len(group) > 0 {
		if len(rest) == 1 || isHelp(rest[1]) {
			fmt.Fprintf(a.stderr, "usage:\n")
			for _, c := range group {
				fmt.Fprintf(a.stderr, "  sluicectl %s\n", c.usage)
			}
			fmt.Fprintf(a.stderr, "each subcommand's flags: sluicectl %s SUBCOMMAND -h\n", rest[0])
			if len(rest) == 1 {
				return exitf(exitUsage, "%s needs a subcommand; see the usage above", rest[0])
			}
			return nil
		}
	}
	var cmd *command
	for _, c := range a.commands() {
		words := strings.Fields(c.name)
		if len(rest) >= len(words) && slices.Equal(rest[:len(words)], words) {
			cmd = &c
			rest = rest[len(words):]
			break
		}
	}
	if cmd == nil {
		top.Usage()
		// The command's words: the group and its next word ("tenant
		// frob"), or the one word of a command of its own, not its flags.
		words := rest[:1]
		if len(a.group(rest[0])) > 0 && len(rest) > 1 {
			words = rest[:2]
		}
		return exitf(exitUsage, "unknown command %q; see the usage above", strings.Join(words, " "))
	}

	fs := flag.NewFlagSet("sluicectl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	exec := cmd.flags(fs)
	own := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { own[f.Name] = true })
	a.g.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(a.stderr, "usage: sluicectl %s\n", cmd.usage)
		printFlags(a.stderr, fs, own)
		fmt.Fprintln(a.stderr, "global flags are listed by: sluicectl -h")
	}
	positional, err := parseInterspersed(fs, rest)
	if err != nil {
		return usageFailure(err)
	}
	if err := a.applyEnv(top, fs); err != nil {
		return err
	}
	return exec(ctx, positional)
}

// group lists the subcommands of a command word such as "tenant", or
// nothing when word is not the first word of several-word commands.
func (a *app) group(word string) []command {
	var out []command
	for _, c := range a.commands() {
		if words := strings.Fields(c.name); len(words) > 1 && words[0] == word {
			out = append(out, c)
		}
	}
	return out
}

// isHelp says whether arg asks for help.
func isHelp(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// usageFailure turns a flag parsing error into exit code 2; the flag
// package has already printed the problem and the usage.
func usageFailure(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &exitError{code: exitUsage}
}

// applyEnv sets global flags given on neither command line from the
// environment.
func (a *app) applyEnv(top, sub *flag.FlagSet) error {
	given := map[string]bool{}
	top.Visit(func(f *flag.Flag) { given[f.Name] = true })
	sub.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	top.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		env := flagenv.EnvName(envPrefix, f.Name)
		if v := a.getenv(env); v != "" {
			if e := top.Set(f.Name, v); e != nil {
				err = exitf(exitUsage, "environment %s=%q: %v", env, v, e)
			}
		}
	})
	return err
}

// parseInterspersed parses flags that may come before, between or after
// positional arguments, and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// printFlags lists the flags of fs named in only, in the flag package's
// format.
func printFlags(w io.Writer, fs *flag.FlagSet, only map[string]bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if !only[f.Name] {
			return
		}
		name, usage := flag.UnquoteUsage(f)
		line := "  -" + f.Name
		if name != "" {
			line += " " + name
		}
		line += "\n    \t" + usage
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "[]" {
			// Quoted for a string only, as the flag package does: a
			// quoted number or duration reads as a string.
			format := " (default %q)"
			if g, ok := f.Value.(flag.Getter); ok {
				if _, isString := g.Get().(string); !isString {
					format = " (default %s)"
				}
			}
			line += fmt.Sprintf(format, f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}

// noPositional refuses positional arguments, pointing at the usual cause.
func noPositional(args []string) error {
	if len(args) == 0 {
		return nil
	}
	if args[0] == "true" || args[0] == "false" {
		return exitf(exitUsage, "unexpected argument %q: boolean flags take their value with =, like -shadow=false", args[0])
	}
	return exitf(exitUsage, "unexpected argument %q; see -h", args[0])
}

// endpoints are the configured etcd endpoints, trimmed.
func (g *globalFlags) endpoints() []string {
	var out []string
	for _, e := range strings.Split(g.etcdEndpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// etcd connects to etcd and returns the client and the config store. The
// caller closes the client.
func (a *app) etcd() (*clientv3.Client, *configstore.Store, error) {
	eps := a.g.endpoints()
	if len(eps) == 0 {
		return nil, nil, exitf(exitUsage, "no etcd endpoints: set -etcd-endpoints or %s", flagenv.EnvName(envPrefix, "etcd-endpoints"))
	}
	if err := etcdflags.CheckEndpoints(eps); err != nil {
		return nil, nil, exitf(exitUsage, "-etcd-endpoints: %v", err)
	}
	if err := a.positiveTimeout(); err != nil {
		return nil, nil, err
	}
	tlsCfg, err := clientTLS(a.g.etcdCA, a.g.etcdCert, a.g.etcdKey, "", "-etcd-")
	if err != nil {
		return nil, nil, err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: a.g.timeout,
		TLS:         tlsCfg,
		Username:    a.g.etcdUsername,
		Password:    a.g.etcdPassword,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, nil, a.etcdFailure(err)
	}
	return cli, configstore.NewStore(cli, a.g.etcdPrefix), nil
}

// etcdFailure explains an etcd error that is neither a conflict nor an
// invalid config: the CLI could not use etcd.
func (a *app) etcdFailure(err error) error {
	return exitf(exitUnreachable, "cannot use etcd at %s: %v\ncheck -etcd-endpoints (%s), the -etcd-ca/-etcd-cert/-etcd-key and -etcd-username/-etcd-password flags, and that etcd is up",
		strings.Join(a.g.endpoints(), ","), err, flagenv.EnvName(envPrefix, "etcd-endpoints"))
}

// positiveTimeout refuses a -timeout that is not positive, with which
// every step (step) would end before it began.
func (a *app) positiveTimeout() error {
	if a.g.timeout <= 0 {
		return exitf(exitUsage, "-timeout must be positive, got %v", a.g.timeout)
	}
	return nil
}

// step bounds one etcd or gRPC step by -timeout.
func (a *app) step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, a.g.timeout)
}

// grpcCredentials are the transport credentials for a Sluice service.
// serverName is the name its certificate must carry (the dialed host when
// empty): -global-tls-name for the global tier.
func (a *app) grpcCredentials(serverName string) (credentials.TransportCredentials, error) {
	tlsCfg, err := clientTLS(a.g.tlsCA, a.g.tlsCert, a.g.tlsKey, serverName, "-tls-")
	if err != nil {
		return nil, err
	}
	if tlsCfg == nil {
		return insecure.NewCredentials(), nil
	}
	if len(tlsCfg.Certificates) == 0 {
		// No -tls-cert: present none, but remember that the service asked
		// for one. A service requiring client certificates closes the
		// connection after the handshake, and the call then fails with a
		// broken pipe, a reset or a TLS alert, depending on timing.
		tlsCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			a.certAsked.Store(true)
			return &tls.Certificate{}, nil
		}
	}
	return credentials.NewTLS(tlsCfg), nil
}

// dialGRPC opens a lazy connection to a Sluice service (a global allocator
// replica or a regional service) with the -tls-* credentials, expecting
// serverName in its certificate (the dialed host when empty).
func (a *app) dialGRPC(addr, serverName string) (*grpc.ClientConn, error) {
	creds, err := a.grpcCredentials(serverName)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, exitf(exitUsage, "address %q: %v", addr, err)
	}
	return conn, nil
}

// clientTLS builds a client TLS config from PEM files, or nil when none is
// given. serverName is the name the server's certificate must carry (the
// dialed host when empty). flagPrefix names the flags in errors ("-etcd-"
// or "-tls-").
func clientTLS(caFile, certFile, keyFile, serverName, flagPrefix string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, exitf(exitUsage, "%scert and %skey go together: give both or neither", flagPrefix, flagPrefix)
	}
	cfg, err := tlsconfig.Client(caFile, certFile, keyFile, serverName)
	if err != nil {
		return nil, exitf(exitInvalid, "%sca/%scert/%skey: %v", flagPrefix, flagPrefix, flagPrefix, err)
	}
	return cfg, nil
}

// problemLines lists the separate problems inside a validation error: the
// members of joined errors, each naming its field. A wrapper around a join
// (like Store.Get's "config: KEY at revision N: ...") is dropped, since its
// members carry the detail.
func problemLines(err error) []string {
	var out []string
	for _, e := range problemErrors(err) {
		out = append(out, e.Error())
	}
	return out
}

// problemErrors is problemLines' problems as errors.
func problemErrors(err error) []error {
	if multi, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range multi.Unwrap() {
			out = append(out, problemErrors(e)...)
		}
		return out
	}
	for inner := errors.Unwrap(err); inner != nil; inner = errors.Unwrap(inner) {
		if _, ok := inner.(interface{ Unwrap() []error }); ok {
			return problemErrors(inner)
		}
	}
	return []error{err}
}

// invalidConfig is exit 1 with every problem on its own line, at most
// config.MaxProblems of them, the rest counted.
func invalidConfig(what string, err error, next string) error {
	lines, total := countedProblems(readableLimit(err))
	var b strings.Builder
	fmt.Fprintf(&b, "%s is invalid (%d problem", what, total)
	if total != 1 {
		b.WriteString("s")
	}
	b.WriteString("):\n")
	for _, l := range lines {
		b.WriteString("  " + strings.ReplaceAll(l, "\n", "\n  ") + "\n")
	}
	if more := total - len(lines); more > 0 {
		fmt.Fprintf(&b, "  and %d more problems not listed\n", more)
	}
	b.WriteString(next)
	return &exitError{code: exitInvalid, msg: b.String()}
}

// countedProblems lists at most config.MaxProblems of the problems in err
// (problemLines), and counts them all: a *config.MoreProblems that ends a
// list cut short counts the problems it stands for, not itself.
func countedProblems(err error) (lines []string, total int) {
	for _, e := range problemErrors(err) {
		if more, ok := e.(*config.MoreProblems); ok {
			total += more.N
			continue
		}
		total++
		if len(lines) < config.MaxProblems {
			lines = append(lines, e.Error())
		}
	}
	return lines, total
}

// readableLimit words a document over configstore.MaxDocumentBytes for
// the person who wrote it; any other error is returned as is.
func readableLimit(err error) error {
	var le *config.LimitError
	if !errors.As(err, &le) || le.Limit != "configstore.MaxDocumentBytes" {
		return err
	}
	return fmt.Errorf("the config without its tenants is %s bytes, more than the %s one etcd key holds (%s bytes); "+
		"tenants are stored under keys of their own and do not count: make the other sections (tiers, classes, envoy) smaller",
		thousands(le.Got), byteSize(le.Max), thousands(le.Max))
}

// thousands writes n with a comma between groups of three digits.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// byteSize writes a whole number of MiB or KiB as such, else bytes.
func byteSize(n int64) string {
	switch {
	case n > 0 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n > 0 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return thousands(n) + " bytes"
}

// storable refuses a config whose document etcd could not hold, as apply
// would, before a diff or an ok is shown.
func storable(cfg *config.Config, what, next string) error {
	if err := configstore.CheckDocument(cfg); err != nil {
		return invalidConfig(what, err, next)
	}
	return nil
}

func sortedNames[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
