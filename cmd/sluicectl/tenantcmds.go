package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/quota"
)

func (a *app) tenantGetCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return exitf(exitUsage, "tenant get takes one tenant name, got %d arguments", len(args))
		}
		_, cfg, rev, done, err := a.openConfig(ctx)
		if err != nil {
			return err
		}
		defer done()
		return writeTenant(a, cfg, rev, args[0])
	}
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
		return a.readModifyWrite(ctx, change, func(cfg *config.Config) error {
			t, listed := cfg.Tenants[name]
			if !listed && *tier == "" {
				return exitf(exitUsage, "tenant %q is not listed yet: give its -tier (tiers: %s)", name, strings.Join(sortedNames(cfg.Tiers), ", "))
			}
			if *tier != "" {
				t.Tier = *tier
			}
			if shadowGiven {
				t.Shadow = *shadow
			}
			for _, class := range removals {
				if _, ok := t.Overrides[class]; !ok {
					return exitf(exitNotFound, "tenant %q has no override for class %q; nothing was written", name, class)
				}
				delete(t.Overrides, class)
			}
			if len(overrides) > 0 && t.Overrides == nil {
				t.Overrides = map[string]config.LimitSpec{}
			}
			for class, spec := range overrides {
				t.Overrides[class] = spec
			}
			if len(t.Overrides) == 0 {
				t.Overrides = nil
			}
			if cfg.Tenants == nil {
				cfg.Tenants = map[string]config.Tenant{}
			}
			cfg.Tenants[name] = t
			return nil
		})
	}
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
		return a.readModifyWrite(ctx, change, func(cfg *config.Config) error {
			if kind == "class" {
				cl, ok := cfg.Classes[name]
				if !ok {
					return exitf(exitNotFound, "class %q is not configured (classes: %s); nothing was written", name, strings.Join(sortedNames(cfg.Classes), ", "))
				}
				cl.Shadow = on
				cfg.Classes[name] = cl
				return nil
			}
			t, ok := cfg.Tenants[name]
			if !ok {
				return exitf(exitNotFound, "tenant %q is not listed under tenants; add it first with: sluicectl tenant set %s -tier TIER -shadow=%t", name, name, on)
			}
			t.Shadow = on
			cfg.Tenants[name] = t
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
