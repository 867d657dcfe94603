package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/configstore"
	"github.com/sluicehq/sluice/pkg/quota"
)

func (a *app) tenantGetCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return exitf(exitUsage, "tenant get takes one tenant name, got %d arguments", len(args))
		}
		if err := quota.ValidateID("tenant id", args[0]); err != nil {
			return exitf(exitInvalid, "%v", err)
		}
		_, view, done, err := a.openTenant(ctx, args[0])
		if err != nil {
			return err
		}
		defer done()
		cfg := view.Config
		if view.Tenant != nil {
			// Resolve sees the tenant as it is stored, apart from the others.
			cfg.Tenants = map[string]config.Tenant{args[0]: *view.Tenant}
		} else {
			cfg.Tenants = nil
		}
		if err := writeTenant(a, cfg, view.Revision, args[0]); err != nil {
			return err
		}
		if view.Tenant == nil {
			// No such tenant (exit 4, as tenant delete and shadow set
			// say); the limits shown are what it would get.
			return exitf(exitNotFound, "tenant %q is not listed under tenants; the limits shown are default_tier %s's, which it gets; list it with: sluicectl tenant set %s -tier TIER",
				args[0], cfg.DefaultTier, args[0])
		}
		return nil
	}
}

// openTenant connects to etcd and reads one tenant with the committed
// config document, without reading the other tenants; done closes the
// connection.
func (a *app) openTenant(ctx context.Context, id string) (*configstore.Store, *configstore.TenantView, func(), error) {
	store, view, _, done, err := a.openTenantFor(ctx, id, false)
	return store, view, done, err
}

// openTenantFor is openTenant for a command that may replace the tenant:
// when replacing, a stored value of the tenant that does not parse is no
// error but returned as unreadable, with the view (its Tenant nil).
func (a *app) openTenantFor(ctx context.Context, id string, replacing bool) (store *configstore.Store, view *configstore.TenantView,
	unreadable error, done func(), err error) {
	cli, store, err := a.store()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	view, err = store.Tenant(ctx, id)
	switch {
	case ctx.Err() != nil:
		err = interrupted(ctx, "reading the config in etcd")
	case errors.Is(err, config.ErrInvalidConfig) && view != nil && view.Config == nil:
		err = invalidConfig(fmt.Sprintf("the config in etcd (%s, revision %d)", store.Key(), view.Revision), err,
			"replace it with: sluicectl apply -f FILE")
	case errors.Is(err, config.ErrInvalidConfig) && replacing:
		unreadable, err = err, nil
		view.Tenant = nil
	case errors.Is(err, config.ErrInvalidConfig):
		err = invalidConfig(fmt.Sprintf("tenant %s in etcd (%s)", id, store.TenantKey(id)), err,
			"replace it with: sluicectl tenant set "+id+" -tier TIER, or sluicectl tenant delete "+id)
	case err != nil:
		err = a.etcdFailure(err)
	case view.Config == nil:
		err = exitf(exitNotFound, "no config in etcd at %s (running daemons keep the config they last loaded from it; one that starts runs its bootstrap config); write one with: sluicectl apply -f FILE", store.Key())
	}
	if err != nil {
		cli.Close()
		return nil, nil, nil, nil, err
	}
	return store, view, unreadable, func() { cli.Close() }, nil
}

// writeTenant prints what the config says about one tenant, including the
// limit it resolves to in every class.
func writeTenant(a *app, cfg *config.Config, rev int64, name string) error {
	if err := quota.ValidateID("tenant id", name); err != nil {
		return exitf(exitInvalid, "%v", err)
	}
	t, listed := cfg.Tenants[name]
	w := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "tenant:\t%s\n", name)
	if listed {
		fmt.Fprintf(w, "tier:\t%s\n", t.Tier)
	} else {
		fmt.Fprintf(w, "tier:\t%s\t(not listed under tenants: gets default_tier)\n", cfg.DefaultTier)
	}
	fmt.Fprintf(w, "shadow:\t%t\n", t.Shadow)
	fmt.Fprintf(w, "config revision:\t%d\n", rev)
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout)

	w = tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "CLASS\tRATE\tBURST\tFROM\tSHADOW")
	for _, class := range sortedNames(cfg.Classes) {
		res, err := cfg.Resolve(quota.Key{Tenant: name, Class: class})
		if err != nil {
			return exitf(exitInvalid, "resolve %s/%s: %v", name, class, err)
		}
		from := "tier " + res.Tier
		if _, ok := t.Overrides[class]; ok {
			from = "override"
		}
		shadow := strconv.FormatBool(res.Shadow)
		if res.Shadow && !t.Shadow {
			shadow += " (class)"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", class, config.Rate(res.Limit.Rate), res.Limit.Burst, from, shadow)
	}
	return w.Flush()
}

// overrideFlag collects -override class=rate,burst values.
type overrideFlag map[string]config.LimitSpec

func (o overrideFlag) String() string {
	var parts []string
	for _, class := range sortedNames(o) {
		parts = append(parts, fmt.Sprintf("%s=%s,%v", class, o[class].Rate, o[class].Burst))
	}
	return strings.Join(parts, " ")
}

func (o overrideFlag) Set(s string) error {
	class, spec, ok := strings.Cut(s, "=")
	rateText, burstText, ok2 := strings.Cut(spec, ",")
	if !ok || !ok2 || class == "" {
		return fmt.Errorf("%q: want class=rate,burst, like write=800/s,1600", s)
	}
	rate, err := config.ParseRate(strings.TrimSpace(rateText))
	if err != nil {
		return fmt.Errorf("%q: %v", s, err)
	}
	burst, err := strconv.ParseFloat(strings.TrimSpace(burstText), 64)
	if err != nil {
		return fmt.Errorf("%q: burst %q is not a number", s, burstText)
	}
	if _, twice := o[class]; twice {
		// Two limits for one class: one would be dropped without a word.
		return fmt.Errorf("%q: class %q has another -override already; give one per class", s, class)
	}
	o[class] = config.LimitSpec{Rate: rate, Burst: burst}
	return nil
}

// listFlag collects repeated string values.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}

func (a *app) tenantSetCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	tier := fs.String("tier", "", "the tenant's tier (required for a tenant not listed yet)")
	shadow := fs.Bool("shadow", false, "put all of the tenant's traffic in shadow mode (write -shadow=false to end it)")
	overrides := overrideFlag{}
	fs.Var(overrides, "override", "replace the tier's limit for one class: class=rate,burst (repeatable)")
	var removals listFlag
	fs.Var(&removals, "remove-override", "drop the tenant's override for a class (repeatable)")
	var change changeFlags
	change.register(fs)
	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			if len(args) > 1 {
				if err := noPositional(args[1:]); err != nil {
					return err
				}
			}
			return exitf(exitUsage, "tenant set takes one tenant name; see -h")
		}
		name := args[0]
		shadowGiven := false
		fs.Visit(func(f *flag.Flag) { shadowGiven = shadowGiven || f.Name == "shadow" })
		for _, class := range removals {
			if _, both := overrides[class]; both {
				return exitf(exitUsage, "class %q is both in -override and -remove-override", class)
			}
		}
		return a.changeTenant(ctx, change, name, func(view *configstore.TenantView, unreadable bool) (*config.Tenant, error) {
			if unreadable && *tier == "" {
				return nil, exitf(exitUsage, "the stored value of tenant %q does not parse: give its -tier to replace it (tiers: %s)", name, strings.Join(sortedNames(view.Config.Tiers), ", "))
			}
			var t config.Tenant
			listed := view.Tenant != nil
			if listed {
				t = *view.Tenant
				t.Overrides = maps.Clone(t.Overrides)
			}
			if !listed && *tier == "" {
				return nil, exitf(exitUsage, "tenant %q is not listed yet: give its -tier (tiers: %s)", name, strings.Join(sortedNames(view.Config.Tiers), ", "))
			}
			if *tier != "" {
				t.Tier = *tier
			}
			if shadowGiven {
				t.Shadow = *shadow
			}
			for _, class := range removals {
				if _, ok := t.Overrides[class]; !ok {
					return nil, exitf(exitNotFound, "tenant %q has no override for class %q; nothing was written", name, class)
				}
				delete(t.Overrides, class)
			}
			if len(overrides) > 0 && t.Overrides == nil {
				t.Overrides = map[string]config.LimitSpec{}
			}
			maps.Copy(t.Overrides, overrides)
			if len(t.Overrides) == 0 {
				t.Overrides = nil
			}
			return &t, nil
		})
	}
}

func (a *app) tenantDeleteCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	var change changeFlags
	change.register(fs)
	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return exitf(exitUsage, "tenant delete takes one tenant name; see -h")
		}
		name := args[0]
		return a.changeTenant(ctx, change, name, func(view *configstore.TenantView, unreadable bool) (*config.Tenant, error) {
			if view.Tenant == nil && !unreadable {
				return nil, exitf(exitNotFound, "tenant %q is not listed (it gets default_tier %s); nothing was written", name, view.Config.DefaultTier)
			}
			return nil, nil
		})
	}
}

func (a *app) tenantListCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	prefix := fs.String("prefix", "", "list only tenants whose id starts with this")
	limit := fs.Int("limit", 0, "list at most this many tenants (0: all)")
	return func(ctx context.Context, args []string) error {
		if err := noPositional(args); err != nil {
			return err
		}
		if *limit < 0 {
			return exitf(exitUsage, "-limit must be >= 0, got %d", *limit)
		}
		cli, store, err := a.store()
		if err != nil {
			return err
		}
		defer cli.Close()
		// One line per tenant, written as read: a million tenants are never
		// all in memory.
		w := bufio.NewWriter(a.stdout)
		defer w.Flush()
		fmt.Fprintln(w, "TENANT\tTIER\tSHADOW\tOVERRIDES")
		n, bad := 0, 0
		rev, err := store.ListTenants(ctx, *prefix, func(e configstore.TenantEntry) bool {
			if e.Err != nil {
				bad++
				fmt.Fprintf(w, "%s\t# does not parse: %v\n", e.ID, strings.ReplaceAll(e.Err.Error(), "\n", "; "))
			} else {
				fmt.Fprintf(w, "%s\t%s\t%t\t%s\n", e.ID, e.Tenant.Tier, e.Tenant.Shadow, overrideFlag(e.Tenant.Overrides))
			}
			n++
			return (*limit == 0 || n < *limit) && ctx.Err() == nil
		})
		switch {
		case ctx.Err() != nil:
			return interrupted(ctx, "listing tenants")
		case err != nil:
			return a.etcdFailure(err)
		}
		if err := w.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(a.stderr, "%d tenants listed at config revision %d\n", n, rev)
		if bad > 0 {
			return exitf(exitInvalid, "%d stored tenants do not parse; fix them with sluicectl tenant set or delete", bad)
		}
		return nil
	}
}

// changeTenant reads one tenant with the config document, lets change
// compute its new value (nil deletes it), shows the diff, asks, and writes
// it in one transaction fenced on the revision read, checking it against
// the document alone.
func (a *app) changeTenant(ctx context.Context, flags changeFlags, name string,
	change func(view *configstore.TenantView, unreadable bool) (*config.Tenant, error)) error {
	if err := quota.ValidateID("tenant id", name); err != nil {
		return exitf(exitInvalid, "%v", err)
	}
	store, view, unreadable, done, err := a.openTenantFor(ctx, name, true)
	if err != nil {
		return err
	}
	defer done()
	if err := a.checkStoredTenants(ctx, store, view, name); err != nil {
		return err
	}
	next, err := change(view, unreadable != nil)
	if err != nil {
		return err
	}
	if unreadable != nil {
		// A value that does not parse cannot be shown: the diff says so.
		fmt.Fprintf(a.stderr, "warning: the stored value of tenant %s does not parse; it is replaced:\n", name)
		for _, l := range problemLines(unreadable) {
			fmt.Fprintln(a.stderr, "  "+l)
		}
	}
	if next != nil {
		if err := view.Config.TenantProblems(name, *next); err != nil {
			return invalidConfig("the changed config", err, "nothing was written")
		}
	}
	var changes []config.TenantChange
	if view.Tenant != nil || next != nil {
		changes = config.TenantChanges(tenantMap(name, view.Tenant), tenantMap(name, next))
	}
	if len(changes) == 0 && unreadable == nil {
		fmt.Fprintf(a.stdout, "no changes (etcd is at revision %d)\n", view.Revision)
		return nil
	}
	if unreadable != nil {
		fmt.Fprintf(a.stdout, "--- current\n+++ proposed\n-  %s: # its stored value does not parse\n", name)
		fmt.Fprint(a.stdout, strings.TrimPrefix(config.DiffTenants(changes, -1, -1), "--- current\n+++ proposed\n"))
	} else {
		fmt.Fprint(a.stdout, config.DiffTenants(changes, -1, -1))
	}
	if ok, err := a.confirm(ctx, flags, false); !ok {
		return err
	}
	if a.beforeWrite != nil {
		a.beforeWrite()
	}
	newRev, err := store.SetTenants(ctx, map[string]*config.Tenant{name: next}, view.Revision)
	return a.written(ctx, store, newRev, view.Revision, err)
}

// checkStoredTenants refuses a tenant change on top of a stored config
// that does not validate, as every command reading the whole config does:
// every daemon refuses such a config, and would refuse it with the change
// too. Each stored tenant but skip (whose new value is checked on its own)
// is checked against the document, read a page at a time, never all at
// once.
func (a *app) checkStoredTenants(ctx context.Context, store *configstore.Store, view *configstore.TenantView, skip string) error {
	var problems []error
	more := 0
	_, err := store.ListTenants(ctx, "", func(e configstore.TenantEntry) bool {
		if e.ID == skip {
			return ctx.Err() == nil
		}
		var p error
		if e.Err != nil {
			p = fmt.Errorf("tenant key %s: %w", store.TenantKey(e.ID), e.Err)
		} else {
			p = view.Config.TenantProblems(e.ID, e.Tenant)
		}
		switch {
		case p == nil:
		case len(problems) < config.MaxProblems:
			problems = append(problems, p)
		default:
			more += len(problemErrors(p))
		}
		return ctx.Err() == nil
	})
	switch {
	case ctx.Err() != nil:
		return interrupted(ctx, "reading the tenants in etcd; nothing was written")
	case err != nil:
		return a.etcdFailure(err)
	case len(problems) == 0:
		return nil
	}
	if more > 0 {
		problems = append(problems, &config.MoreProblems{N: more})
	}
	return invalidConfig(fmt.Sprintf("the config in etcd (%s, revision %d) with its stored tenants", store.Key(), view.Revision),
		errors.Join(problems...),
		"every daemon refuses it, and would refuse this change on top of it: fix those tenants first "+
			"(sluicectl tenant set ID -tier TIER, or sluicectl tenant delete ID) or replace the config with: sluicectl apply -f FILE; nothing was written")
}

func tenantMap(name string, t *config.Tenant) map[string]config.Tenant {
	if t == nil {
		return nil
	}
	return map[string]config.Tenant{name: *t}
}

func (a *app) shadowSetCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	var change changeFlags
	change.register(fs)
	return func(ctx context.Context, args []string) error {
		if len(args) != 3 || (args[0] != "class" && args[0] != "tenant") {
			return exitf(exitUsage, "usage: sluicectl shadow set (class NAME | tenant NAME) on|off")
		}
		kind, name := args[0], args[1]
		var on bool
		switch args[2] {
		case "on":
			on = true
		case "off":
		default:
			return exitf(exitUsage, "shadow set: want on or off, got %q", args[2])
		}
		if kind == "tenant" {
			return a.changeTenant(ctx, change, name, func(view *configstore.TenantView, unreadable bool) (*config.Tenant, error) {
				if unreadable {
					return nil, exitf(exitInvalid, "the stored value of tenant %q does not parse; replace it with: sluicectl tenant set %s -tier TIER -shadow=%t; nothing was written", name, name, on)
				}
				if view.Tenant == nil {
					return nil, exitf(exitNotFound, "tenant %q is not listed under tenants; add it first with: sluicectl tenant set %s -tier TIER -shadow=%t", name, name, on)
				}
				t := *view.Tenant
				t.Shadow = on
				return &t, nil
			})
		}
		return a.readModifyWrite(ctx, change, func(cfg *config.Config) error {
			cl, ok := cfg.Classes[name]
			if !ok {
				return exitf(exitNotFound, "class %q is not configured (classes: %s); nothing was written", name, strings.Join(sortedNames(cfg.Classes), ", "))
			}
			cl.Shadow = on
			cfg.Classes[name] = cl
			return nil
		})
	}
}

// readModifyWrite reads the config and its revision, lets modify change a
// copy, and commits the copy guarded by that revision.
func (a *app) readModifyWrite(ctx context.Context, change changeFlags, modify func(*config.Config) error) error {
	store, current, rev, done, err := a.openConfig(ctx)
	if err != nil {
		return err
	}
	defer done()
	next, err := cloneConfig(current)
	if err != nil {
		return exitf(exitInvalid, "copy the config: %v", err)
	}
	if err := modify(next); err != nil {
		return err
	}
	return a.commit(ctx, store, current, rev, next, change, false)
}
