package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/hierarchy"
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
		if drain {
			// A drain asks -global-addr once it has written: an address
			// that is not host:port is refused before anything is.
			if _, err := a.globalAddrs(); err != nil {
				return err
			}
		}
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
		down := a.silentRegions(ctx)
		if drain {
			for i := range down {
				if down[i].Region == name {
					fmt.Fprintln(a.stdout, drainSilentTiming(timing, name, &down[i]))
					return nil
				}
			}
		} else if len(down) > 0 {
			fmt.Fprintln(a.stdout, restoreSilentTiming(name, down))
			return nil
		}
		fmt.Fprintln(a.stdout, drainTiming(timing, name, drain))
		return nil
	}
}

// silentRegions asks the global tier (the leader etcd names, or
// -global-addr) how it sees the regions and returns, in its order, those
// it does not hear from (silent or lapsed): down, or cut off, such a
// region cannot adopt a drain, nor report the revision a restore waits
// for. nil when every region reports, or when the global tier cannot be
// asked (the change is written either way; status tells the rest).
func (a *app) silentRegions(ctx context.Context) []regionView {
	var rep statusReport
	if len(a.g.endpoints()) > 0 {
		if err := a.readEtcdStatus(ctx, &rep); err != nil {
			return nil
		}
	}
	addrs, err := a.globalAddrs()
	if err != nil {
		return nil
	}
	if len(addrs) == 0 && rep.GlobalLeader != nil {
		addrs = []string{rep.GlobalLeader.Addr}
	}
	if len(addrs) == 0 {
		return nil
	}
	if err := a.askFirst(ctx, addrs, 1, &rep); err != nil || rep.Global == nil || !rep.Global.AnsweredByLeader {
		return nil
	}
	var out []regionView
	for _, r := range rep.Global.Regions {
		if r.Silent || r.Lapsed {
			out = append(out, r)
		}
	}
	return out
}

// restoreSilentTiming is drainTiming for a restore while regions the
// global tier does not hear from are configured: a raised static share
// waits until every region reported the new revision, so it waits for
// them to report again, however long they stay down or cut off.
func restoreSilentTiming(region string, down []regionView) string {
	names := make([]string, 0, len(down))
	self := false
	for _, r := range down {
		since := ""
		if r.SilentSince != nil {
			since = " since " + r.SilentSince.Local().Format("15:04:05.000")
		}
		names = append(names, r.Region+since)
		self = self || r.Region == region
	}
	if self && len(down) == 1 {
		return fmt.Sprintf("the global tier hears no report from %s: %s's static share rises only once every region has adopted this revision, "+
			"so not before %s is back and reports it; it then climbs from its floor through grants, fenced. "+
			"Watch it with: sluicectl status (state live)", strings.Join(names, ", "), region, region)
	}
	return fmt.Sprintf("the global tier hears no report from %s: %s's static share rises only once every region has adopted this revision, "+
		"so not before %s again (or leaves the config: drained, then applied without it). Until then %s runs on its floor under its static lease, and on grants above it, fenced. "+
		"Watch it with: sluicectl status (STATIC/S of its keys)", strings.Join(names, ", "), region, reportAgain(down), region)
}

// reportAgain says that the regions of views report: "a reports", "a and
// b report", "a, b and c report".
func reportAgain(views []regionView) string {
	names := make([]string, len(views))
	for i, r := range views {
		names[i] = r.Region
	}
	if len(names) == 1 {
		return names[0] + " reports"
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1] + " report"
}

// drainSilentTiming is drainTiming for a region the global tier does not
// hear from: it cannot report the new revision (one cut off from the global
// tier alone still loads it from etcd and runs on its floor), so the drain moves nothing
// sooner; its share moves when its static lease lapses, as for any region
// that is down (or has moved already when it lapsed).
func drainSilentTiming(cfg *config.Config, region string, r *regionView) string {
	since := ""
	if r.SilentSince != nil {
		since = " since " + r.SilentSince.Local().Format("15:04:05.000")
	}
	if r.Lapsed {
		return fmt.Sprintf("%s is silent%s and its static lease has lapsed: the global tier already counts it at its floor and its share is with the other regions; "+
			"the drain keeps it on its floor when it comes back. Watch it with: sluicectl status", region, since)
	}
	lease, validity, epoch := time.Duration(cfg.RegionLease), time.Duration(cfg.GrantValidity), time.Duration(cfg.Epoch)
	lapse := lease + validity + time.Duration(hierarchy.LapseMargin(epoch, lease))
	when := ""
	if r.SilentSince != nil {
		when = fmt.Sprintf(", at about %s", r.SilentSince.Add(lapse).Local().Format("15:04:05.000"))
	}
	return fmt.Sprintf("%s is silent%s (the global tier hears no report from it): it cannot report this revision (if it still reaches etcd it loads it and runs on its floor, but the global tier cannot know that), so the drain does not move its share sooner. "+
		"The global tier keeps reserving its share until its static lease lapses, region_lease + grant_validity + max(epoch, 1%% of region_lease) = %v after its last report%s, "+
		"then gives it to the other regions above its floor. Watch it with: sluicectl status (DRAINED in the config, SILENT)", region, since, lapse, when)
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
	return fmt.Sprintf("grants bring %s's share back from the others, fenced, as its demand asks (nothing is over-admitted meanwhile); "+
		"its static share rises once every region has reported this revision (a few epochs of %v) "+
		"and grant_validity + epoch = %v more have passed, so that every grant sized with it at its floor has ended. "+
		"Watch it with: sluicectl status (state live)", region, epoch, validity+epoch)
}
