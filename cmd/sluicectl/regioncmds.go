package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
)

// unchanged ends a change command that found nothing to do: its message
// goes to stdout and the command succeeds without writing.
type unchanged struct{ msg string }

func (u *unchanged) Error() string { return u.msg }

func (a *app) regionDrainCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	return a.regionDrainedCmd(fs, true)
}

func (a *app) regionRestoreCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	return a.regionDrainedCmd(fs, false)
}

// regionDrainedCmd sets (drain) or clears (restore) regions.NAME.drained
// through the same read, diff, confirm and revision-guarded write as every
// other change.
func (a *app) regionDrainedCmd(fs *flag.FlagSet, drain bool) func(context.Context, []string) error {
	var change changeFlags
	change.register(fs)
	verb := "restore"
	if drain {
		verb = "drain"
	}
	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			if len(args) > 1 {
				if err := noPositional(args[1:]); err != nil {
					return err
				}
			}
			return exitf(exitUsage, "region %s takes one region name; see -h", verb)
		}
		name := args[0]
		var timing *config.Config
		err := a.readModifyWrite(ctx, change, func(cfg *config.Config) error {
			r, ok := cfg.Regions[name]
			if !ok {
				return exitf(exitNotFound, "region %q is not configured (regions: %s); nothing was written",
					name, strings.Join(sortedNames(cfg.Regions), ", "))
			}
			if r.Drained == drain {
				if drain {
					return &unchanged{fmt.Sprintf("region %s is already drained; nothing to write", name)}
				}
				return &unchanged{fmt.Sprintf("region %s is not drained; nothing to write", name)}
			}
			if drain {
				var serving []string
				for _, other := range sortedNames(cfg.Regions) {
					if other != name && !cfg.Regions[other].Drained {
						serving = append(serving, other)
					}
				}
				if len(serving) == 0 {
					return exitf(exitInvalid, "cannot drain %s: it is the last region not drained, and at least one region must serve; restore another region first; nothing was written", name)
				}
			}
			r.Drained = drain
			cfg.Regions[name] = r
			timing = cfg
			return nil
		})
		var u *unchanged
		if errors.As(err, &u) {
			fmt.Fprintln(a.stdout, u.msg)
			return nil
		}
		if err != nil || change.dryRun || timing == nil {
			return err
		}
		// A declined prompt or a conflict returned above; here the change
		// was written (or the diff was empty, which the checks rule out).
		fmt.Fprintln(a.stdout, drainTiming(timing, name, drain))
		return nil
	}
}

// drainTiming tells the operator what happens next and when, in the
// config's own periods.
func drainTiming(cfg *config.Config, region string, drain bool) string {
	validity, epoch := time.Duration(cfg.GrantValidity), time.Duration(cfg.Epoch)
	if drain {
		return fmt.Sprintf("%s runs on its floor (each class's partition_share of its static share) once its replicas load this revision; "+
			"its share goes to the other regions as its grants expire: within about grant_validity + 2 × epoch = %v. "+
			"Watch it with: sluicectl status (state drained)", region, validity+2*epoch)
	}
	return fmt.Sprintf("%s's static share rises once every region has adopted this revision (at most a few epochs of %v), "+
		"then grants bring its share back from the others, fenced: nothing is over-admitted meanwhile. "+
		"Watch it with: sluicectl status (state live)", region, epoch)
}
