package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/allocator"
	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/envoyrls/importer"
)

// readConfigFile parses and validates a config file ("-" is stdin).
func (a *app) readConfigFile(file string) (*config.Config, error) {
	return a.readConfigFileContext(context.Background(), file)
}

// readConfigFileContext is readConfigFile that stops when ctx is done (on
// SIGINT or SIGTERM). A file over config.MaxConfigBytes is refused before
// it is read.
func (a *app) readConfigFileContext(ctx context.Context, file string) (*config.Config, error) {
	if file == "" {
		return nil, exitf(exitUsage, "no config file: give -f FILE (or -f - for stdin)")
	}
	tooBig := func(n int64) error {
		return invalidConfig("config "+file, &config.LimitError{Limit: "config.MaxConfigBytes", Max: config.MaxConfigBytes, Got: n, What: "bytes"},
			"split the tenants off or raise nothing: the limit is fixed; nothing was written")
	}
	name := file
	var src io.Reader
	if file == "-" {
		src, name = a.stdin, "stdin"
	} else {
		st, err := os.Stat(file)
		if err != nil {
			return nil, exitf(exitInvalid, "cannot read config: %v", err)
		}
		if st.Size() > config.MaxConfigBytes {
			return nil, tooBig(st.Size())
		}
		f, err := os.Open(file)
		if err != nil {
			return nil, exitf(exitInvalid, "cannot read config: %v", err)
		}
		defer f.Close()
		src = f
	}
	// A read blocks in the kernel (a pipe, a slow disk), where ctx cannot
	// reach it: it runs aside, and an interrupted command returns without it.
	type read struct {
		data []byte
		err  error
	}
	done := make(chan read, 1)
	go func() {
		data, err := io.ReadAll(io.LimitReader(src, config.MaxConfigBytes+1))
		done <- read{data, err}
	}()
	var data []byte
	var err error
	select {
	case r := <-done:
		data, err = r.data, r.err
	case <-ctx.Done():
		return nil, interrupted(ctx, "reading config "+name+"; nothing was written")
	}
	if err != nil {
		return nil, exitf(exitInvalid, "cannot read config: %v", err)
	}
	if len(data) > config.MaxConfigBytes {
		return nil, tooBig(int64(len(data)))
	}
	cfg, err := config.ParseContext(ctx, data)
	if err != nil {
		if ctx.Err() != nil {
			return nil, interrupted(ctx, "reading config "+name+"; nothing was written")
		}
		return nil, invalidConfig("config "+name, err, "fix the problems above and run again; nothing was written")
	}
	return cfg, nil
}

// interrupted ends a command stopped by SIGINT or SIGTERM.
func interrupted(ctx context.Context, what string) error {
	return exitf(exitInterrupted, "interrupted (%v) while %s", context.Cause(ctx), what)
}

// store connects to etcd for a config command: each etcd request is
// bounded by -timeout, the whole command only by ctx, since a config of a
// million tenants takes many requests.
func (a *app) store() (*clientv3.Client, *configstore.Store, error) {
	cli, store, err := a.etcd()
	if err != nil {
		return nil, nil, err
	}
	store.SetRequestTimeout(a.g.timeout)
	return cli, store, nil
}

func (a *app) validateCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	file := fs.String("f", "", `config file to check ("-" reads stdin)`)
	return func(ctx context.Context, args []string) error {
		if err := noPositional(args); err != nil {
			return err
		}
		cfg, err := a.readConfigFileContext(ctx, *file)
		if err != nil {
			return err
		}
		name := "config " + *file
		if *file == "-" {
			name = "config stdin"
		}
		if err := storable(cfg, name, "fix the problems above: apply would refuse it"); err != nil {
			return err
		}
		for _, n := range importer.DigestedPrefixes(cfg) {
			fmt.Fprintln(a.stderr, "note: "+n)
		}
		a.warnFailover(cfg)
		fmt.Fprintf(a.stdout, "ok: %d regions, %d classes, %d tiers, %d tenants\n",
			len(cfg.Regions), len(cfg.Classes), len(cfg.Tiers), len(cfg.Tenants))
		return nil
	}
}

// warnFailover warns (stderr; the config is valid and the command goes on)
// when cfg's region_lease is shorter than the failover of a global tier
// running the default -session-ttl (allocator.FailoverBound): nothing is
// over-admitted, but a global leader that dies without resigning would put
// every region on its floor. The global replicas check their own
// -session-ttl on every config they load.
func (a *app) warnFailover(cfg *config.Config) {
	below, bound := allocator.RegionLeaseBelowFailover(cfg, allocator.DefaultSessionTTL)
	if !below {
		return
	}
	fmt.Fprintf(a.stderr, "warning: region_lease %v is shorter than the global tier's failover with the default -session-ttl %v "+
		"(session TTL + 0.5s + 5.25 × epoch = %v): a global leader that dies without resigning puts every region on its floor "+
		"(each class's partition_share) until a leader answers; raise region_lease to at least %v (docs/config.md, region_lease; "+
		"global replicas check their own -session-ttl and set sluice_global_region_lease_below_failover)\n",
		time.Duration(cfg.RegionLease), allocator.DefaultSessionTTL, bound, bound)
}

// changeFlags are the flags of every command that writes the config.
type changeFlags struct {
	// yes skips the confirmation prompt.
	yes bool
	// dryRun shows the diff and writes nothing.
	dryRun bool
	// takeover finishes an interrupted batched apply (apply only).
	takeover bool
}

func (c *changeFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.yes, "yes", false, "write without asking for confirmation")
	fs.BoolVar(&c.dryRun, "dry-run", false, "show the diff and write nothing")
}

func (a *app) applyCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	file := fs.String("f", "", `config file to apply ("-" reads stdin)`)
	var change changeFlags
	change.register(fs)
	fs.BoolVar(&change.takeover, "takeover", false, "finish an apply that was interrupted while writing its tenants in batches")
	return func(ctx context.Context, args []string) error {
		if err := noPositional(args); err != nil {
			return err
		}
		next, err := a.readConfigFileContext(ctx, *file)
		if err != nil {
			return err
		}
		a.warnFailover(next)
		cli, store, err := a.store()
		if err != nil {
			return err
		}
		defer cli.Close()
		current, rev, err := store.Get(ctx)
		switch {
		case ctx.Err() != nil:
			return interrupted(ctx, "reading the config in etcd; nothing was written")
		case errors.Is(err, configstore.ErrApplyInProgress) && change.takeover:
			// The config committed before the interrupted apply is compacted
			// away: the diff is shown against nothing, and the fence is the
			// document's current revision.
			fmt.Fprintf(a.stderr, "warning: %v; the diff below is against an empty config\n", err)
			if rev, err = store.Revision(ctx); err != nil {
				return a.etcdFailure(err)
			}
			current = nil
		case errors.Is(err, config.ErrInvalidConfig):
			// The stored config is unusable anyway; replacing it is what apply
			// is for. The daemons keep running on their last good config.
			fmt.Fprintf(a.stderr, "warning: the config in etcd at revision %d does not validate; it will be replaced:\n", rev)
			lines, total := countedProblems(err)
			for _, l := range lines {
				fmt.Fprintln(a.stderr, "  "+l)
			}
			if more := total - len(lines); more > 0 {
				fmt.Fprintf(a.stderr, "  and %d more problems not listed\n", more)
			}
			// Its tenants are keys of their own, still readable: the diff
			// shows those the apply deletes or changes.
			stored, err := a.storedTenants(ctx, store)
			if err != nil {
				return err
			}
			return a.commitWith(ctx, store, rev, next, change, *file == "-", func() string {
				return diffOverTenants(stored, next)
			})
		case err != nil:
			return a.etcdFailure(err)
		}
		a.warnShardsWithoutLeader(ctx, cli, store, current, next)
		return a.commit(ctx, store, current, rev, next, change, *file == "-")
	}
}

// warnShardsWithoutLeader warns (stderr; the command goes on) when next
// raises global_shards to include shards no replica leads: a region takes
// a moved key's grants only from its new owner and runs it on its static
// share only under that owner's static lease, which a shard that never
// led never conferred, so every key moving to such a shard runs on its
// floor in every region until one of its replicas leads
// (docs/operations.md, "A sharded global tier": start the new shard's
// replicas first).
func (a *app) warnShardsWithoutLeader(ctx context.Context, cli *clientv3.Client, store *configstore.Store, current, next *config.Config) {
	if current == nil {
		return
	}
	from, to := current.ShardMap().N(), next.ShardMap().N()
	if to <= from {
		return
	}
	stepCtx, cancel := a.step(ctx)
	defer cancel()
	resp, err := cli.Get(stepCtx, store.ElectionPrefix()+"global-shard-", clientv3.WithPrefix())
	if err != nil {
		fmt.Fprintf(a.stderr, "warning: global_shards %d -> %d: could not check that shards %d..%d have a leader: %v\n", from, to, from, to-1, err)
		return
	}
	leaders := shardLeaders(store.ElectionPrefix(), resp.Kvs)
	var missing []string
	for i := from; i < to; i++ {
		if leaders[i] == nil {
			missing = append(missing, strconv.Itoa(i))
		}
	}
	if len(missing) == 0 {
		return
	}
	fmt.Fprintf(a.stderr, "warning: global_shards %d -> %d, but no replica leads shard %s (no replica holds %sglobal-shard-I): "+
		"start its replicas first (cmd/global -shard I) and apply once they lead; applied now, every key moving to it runs on its floor "+
		"(each class's partition_share) in every region until one of them leads (docs/operations.md, A sharded global tier)\n",
		from, to, strings.Join(missing, ", "), store.ElectionPrefix())
}

// storedTenants reads the tenants stored under keys of their own, for a
// diff over a stored document that does not validate. Tenants whose value
// does not parse cannot be shown; they are counted in a warning.
func (a *app) storedTenants(ctx context.Context, store *configstore.Store) (map[string]config.Tenant, error) {
	stored := map[string]config.Tenant{}
	var bad []string
	_, err := store.ListTenants(ctx, "", func(e configstore.TenantEntry) bool {
		if e.Err != nil {
			bad = append(bad, e.ID)
		} else {
			stored[e.ID] = e.Tenant
		}
		return ctx.Err() == nil
	})
	switch {
	case ctx.Err() != nil:
		return nil, interrupted(ctx, "reading the tenants in etcd; nothing was written")
	case err != nil:
		return nil, a.etcdFailure(err)
	}
	if len(bad) > 0 {
		fmt.Fprintf(a.stderr, "warning: %d stored tenants do not parse (the first: %s); the apply replaces or deletes them too, though the diff below cannot show them\n",
			len(bad), bad[0])
	}
	return stored, nil
}

// diffOverTenants is the diff from a stored config whose document is
// unusable (shown as absent) but whose tenants, stored apart, are known,
// to next: the document as added, then one line per tenant added,
// changed or deleted.
func diffOverTenants(stored map[string]config.Tenant, next *config.Config) string {
	doc := *next
	doc.Tenants = nil
	out := config.Diff(nil, &doc)
	tenants := config.DiffTenants(config.TenantChanges(stored, next.Tenants), len(stored), len(next.Tenants))
	if out == "" || tenants == "" {
		return out + tenants
	}
	return out + strings.TrimPrefix(tenants, "--- current\n+++ proposed\n")
}

// commit shows the diff from current (at revision rev; nil when absent)
// to next, asks for confirmation unless told not to, and writes next in
// one transaction guarded by rev. stdinUsed says stdin held the config,
// so it cannot answer a prompt.
func (a *app) commit(ctx context.Context, store *configstore.Store, current *config.Config, rev int64,
	next *config.Config, change changeFlags, stdinUsed bool) error {
	if err := config.RemovalProblems(current, next); err != nil {
		return invalidConfig("the change", err, "nothing was written")
	}
	return a.commitWith(ctx, store, rev, next, change, stdinUsed, func() string { return config.Diff(current, next) })
}

// commitWith is commit showing the diff that diff computes, once next
// validated.
func (a *app) commitWith(ctx context.Context, store *configstore.Store, rev int64,
	next *config.Config, change changeFlags, stdinUsed bool, diff func() string) error {
	if err := next.ValidateContext(ctx); err != nil {
		if ctx.Err() != nil {
			return interrupted(ctx, "validating; nothing was written")
		}
		return invalidConfig("the changed config", err, "nothing was written")
	}
	if err := storable(next, "the changed config", "nothing was written"); err != nil {
		return err
	}
	shown := diff()
	if shown == "" && !change.takeover {
		fmt.Fprintf(a.stdout, "no changes (etcd is at revision %d)\n", rev)
		return nil
	}
	fmt.Fprint(a.stdout, shown)
	if ok, err := a.confirm(ctx, change, stdinUsed); !ok {
		return err
	}
	if a.beforeWrite != nil {
		a.beforeWrite()
	}
	opts := configstore.ApplyOptions{Takeover: change.takeover, Progress: a.progress()}
	newRev, err := store.ApplyWith(ctx, next, rev, opts)
	return a.written(ctx, store, newRev, rev, err)
}

// confirm says whether to write: -dry-run never (nil error), -yes always,
// else the answer to a prompt on a terminal. SIGINT or SIGTERM (ctx done)
// ends the prompt at once, without waiting for a line.
func (a *app) confirm(ctx context.Context, change changeFlags, stdinUsed bool) (bool, error) {
	if change.dryRun {
		fmt.Fprintln(a.stderr, "dry run: nothing written")
		return false, nil
	}
	if change.yes {
		return true, nil
	}
	if stdinUsed || !a.stdinIsTerminal() {
		return false, exitf(exitUsage, "not applied: stdin is not a terminal, so confirmation cannot be asked; pass --yes to write without asking (or --dry-run to only see the diff)")
	}
	fmt.Fprint(a.stderr, "apply? [y/N] ")
	// The read blocks in the kernel, where ctx cannot reach it: it runs
	// aside, and an interrupted prompt returns without it.
	answered := make(chan string, 1)
	go func() {
		answer, _ := bufio.NewReader(a.stdin).ReadString('\n')
		answered <- answer
	}()
	var answer string
	select {
	case answer = <-answered:
	case <-ctx.Done():
		fmt.Fprintln(a.stderr)
		return false, interrupted(ctx, "asking for confirmation; nothing was written")
	}
	if ctx.Err() != nil {
		return false, interrupted(ctx, "asking for confirmation; nothing was written")
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true, nil
	}
	return false, exitf(exitInvalid, "not applied: declined; nothing was written")
}

// progress reports a batched apply's tenant writes on stderr, about every
// tenth of them.
func (a *app) progress() func(done, total int) {
	last := 0
	return func(done, total int) {
		if done == total || done-last >= max(total/10, 1) {
			fmt.Fprintf(a.stderr, "wrote %d of %d tenant changes\n", done, total)
			last = done
		}
	}
}

// written reports the outcome of a write computed from revision rev.
func (a *app) written(ctx context.Context, store *configstore.Store, newRev, rev int64, err error) error {
	switch {
	case errors.Is(err, configstore.ErrApplyInProgress):
		return exitf(exitConflict, "not applied: %v; nothing was written", err)
	case errors.Is(err, configstore.ErrConflict):
		return exitf(exitConflict, "not applied: the config in etcd changed after it was read at revision %d (%v); nothing was written; run the command again to see the diff against the new config", rev, err)
	case errors.Is(err, config.ErrInvalidConfig):
		return invalidConfig("the changed config", err, "nothing was written")
	case errors.Is(err, configstore.ErrInterrupted) && ctx.Err() != nil:
		return interrupted(ctx, fmt.Sprintf("writing: %v; run the same apply with -takeover to finish it", err))
	case errors.Is(err, configstore.ErrInterrupted):
		return exitf(exitUnreachable, "%v; run the same apply with -takeover to finish it", err)
	case ctx.Err() != nil:
		return interrupted(ctx, "writing; "+a.unanswered(store, rev))
	case err != nil:
		return a.etcdFailure(fmt.Errorf("write: %w\n%s", err, a.unanswered(store, rev)))
	}
	fmt.Fprintf(a.stdout, "applied: revision %d\n", newRev)
	return nil
}

// unanswered says what is known of a write computed from revision rev that
// got no answer: etcd may have committed it (the request reached etcd and
// its answer was lost, or the command stopped waiting), so nothing says it
// was not written. The config revision is read again on a context of its
// own (the command's may have ended), bounded by -timeout and 2 s.
func (a *app) unanswered(store *configstore.Store, rev int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), min(a.g.timeout, 2*time.Second))
	defer cancel()
	now, err := store.Revision(ctx)
	switch {
	case err != nil:
		return fmt.Sprintf("the change may have been written: etcd did not say; run sluicectl get once it answers (revision %d there means it was not)", rev)
	case now != rev:
		return fmt.Sprintf("the change may have been written: the config in etcd is at revision %d now, read at %d; run sluicectl get to see what is live", now, rev)
	default:
		return fmt.Sprintf("the change may have been written: the config in etcd is still at revision %d, but etcd may yet commit the write it was sent; run sluicectl get to see what is live", rev)
	}
}

func (a *app) getCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	format := fs.String("o", "yaml", "output format: yaml or json")
	return func(ctx context.Context, args []string) error {
		if err := noPositional(args); err != nil {
			return err
		}
		if *format != "yaml" && *format != "json" {
			return exitf(exitUsage, "-o %q: want yaml or json", *format)
		}
		_, cfg, rev, done, err := a.openConfig(ctx)
		if err != nil {
			return err
		}
		defer done()
		if *format == "yaml" {
			fmt.Fprintf(a.stderr, "revision %d\n", rev)
			if err := cfg.WriteYAMLContext(ctx, a.stdout); err != nil {
				if ctx.Err() != nil {
					return interrupted(ctx, "printing the config")
				}
				return exitf(exitInvalid, "render config: %v", err)
			}
			return nil
		}
		data, err := cfg.Marshal()
		if err != nil {
			return exitf(exitInvalid, "render config: %v", err)
		}
		if *format == "json" {
			if data, err = yamlToJSON(data); err != nil {
				return exitf(exitInvalid, "render config as JSON: %v", err)
			}
		}
		fmt.Fprintf(a.stderr, "revision %d\n", rev)
		_, err = a.stdout.Write(data)
		return err
	}
}

// openConfig connects to etcd and reads the config for a command that
// needs one; the caller calls done when finished with the store.
func (a *app) openConfig(ctx context.Context) (store *configstore.Store, cfg *config.Config, rev int64, done func(), err error) {
	cli, store, err := a.store()
	if err != nil {
		return nil, nil, 0, nil, err
	}
	if cfg, rev, err = a.currentConfig(ctx, store); err != nil {
		cli.Close()
		return nil, nil, 0, nil, err
	}
	return store, cfg, rev, func() { cli.Close() }, nil
}

// currentConfig reads the config from etcd for a command that needs one:
// absent is exit 4, unparsable exit 1.
func (a *app) currentConfig(ctx context.Context, store *configstore.Store) (*config.Config, int64, error) {
	store.SetRequestTimeout(a.g.timeout)
	cfg, rev, err := store.Get(ctx)
	switch {
	case ctx.Err() != nil:
		return nil, 0, interrupted(ctx, "reading the config in etcd")
	case errors.Is(err, config.ErrInvalidConfig):
		return nil, rev, invalidConfig(fmt.Sprintf("the config in etcd (%s, revision %d)", store.Key(), rev), err,
			"replace it with: sluicectl apply -f FILE")
	case err != nil:
		return nil, 0, a.etcdFailure(err)
	case cfg == nil:
		return nil, 0, exitf(exitNotFound, "no config in etcd at %s (running daemons keep the config they last loaded from it; one that starts runs its bootstrap config); write one with: sluicectl apply -f FILE", store.Key())
	}
	return cfg, rev, nil
}

// yamlToJSON re-encodes the config's YAML rendering as indented JSON, so
// rates and durations keep their written forms ("10/s", "1s").
func yamlToJSON(data []byte) ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// cloneConfig returns a deep copy of cfg, for read-modify-write: the copy
// is changed while the original is kept for the diff. Everything but the
// tenants is copied through its YAML form; the tenants map is copied, not
// the tenants in it, which read-modify-write never changes in place.
func cloneConfig(cfg *config.Config) (*config.Config, error) {
	base := *cfg
	base.Tenants = nil
	data, err := base.Marshal()
	if err != nil {
		return nil, err
	}
	out, err := config.Parse(data)
	if err != nil {
		return nil, err
	}
	out.Tenants = maps.Clone(cfg.Tenants)
	return out, nil
}
