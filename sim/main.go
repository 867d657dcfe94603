package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/flagenv"
	"github.com/sluicehq/sluice/internal/version"
	"github.com/sluicehq/sluice/sim/live"
	"github.com/sluicehq/sluice/sim/report"
	"github.com/sluicehq/sluice/sim/runner"
	scalesim "github.com/sluicehq/sluice/sim/scale"
	"github.com/sluicehq/sluice/sim/scenario"
	"github.com/sluicehq/sluice/sim/scenarios"
)

// Exit statuses.
const (
	exitOK        = 0
	exitViolation = 1
	exitUsage     = 2
	exitMissed    = 3
	// exitInterrupted: stopped by SIGINT (128 + 2, as a shell reports it).
	exitInterrupted = 130
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("scenario", scenarios.Default, "shipped scenario name, or a path to a scenario YAML file")
	seed := fs.Uint64("seed", 0, "random seed, from 1 (default: the scenario's)")
	duration := fs.Duration("duration", 0, "simulated duration (0: the scenario's); later faults are dropped, the scenario's warmup is kept (a duration not longer than it is refused)")
	out := fs.String("out", "sim-out", "directory for report.html, summary.txt, timeseries.csv and the charts, replacing those of the last run there (\"\": none)")
	list := fs.Bool("list", false, "list the shipped scenarios and exit")
	liveMode := fs.Bool("live", false, "play the scenario against real daemons (embedded etcd, redis-server or an embedded Redis, gRPC on loopback)")
	scale := fs.Float64("scale", live.DefaultScale, "live mode: virtual seconds per wall second (refused without -live)")
	daemonLog := fs.String("daemon-log", "", "live mode: file the daemons' own structured logs are written to, replacing it (elections, failed syncs, outages; refused without -live)")
	showVersion := fs.Bool(flagenv.VersionFlag, false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK // help asked for is no bad usage
		}
		return exitUsage
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.String("sim"))
		return exitOK
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sim: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if *duration < 0 {
		fmt.Fprintf(stderr, "sim: -duration %v must not be negative (0 runs the scenario's own)\n", *duration)
		return exitUsage
	}
	if *duration > scenario.MaxDuration {
		fmt.Fprintf(stderr, "sim: -duration %v is more than the longest run, %v\n", *duration, scenario.MaxDuration)
		return exitUsage
	}
	scaleSet, seedSet := false, false
	fs.Visit(func(f *flag.Flag) {
		scaleSet = scaleSet || f.Name == "scale" || f.Name == "daemon-log"
		seedSet = seedSet || f.Name == "seed"
	})
	if seedSet && *seed == 0 {
		fmt.Fprintf(stderr, "sim: -seed 0 is not a seed: seeds start at 1 (leave -seed out for the scenario's)\n")
		return exitUsage
	}
	if scaleSet && !*liveMode {
		fmt.Fprintf(stderr, "sim: -scale and -daemon-log only apply to -live (virtual mode runs as fast as it can, with no daemons); add -live or drop them\n")
		return exitUsage
	}
	if !(*scale > 0) || math.IsInf(*scale, 1) {
		fmt.Fprintf(stderr, "sim: -scale %v must be a positive number\n", *scale)
		return exitUsage
	}
	if *list {
		type entry struct {
			name, about string
			d           time.Duration
		}
		var rows []entry
		for _, n := range scalesim.Names() {
			sp, err := scalesim.Load(n)
			if err != nil {
				fmt.Fprintf(stderr, "sim: %v\n", err)
				return exitUsage
			}
			rows = append(rows, entry{n, firstSentence(sp.Description), time.Duration(sp.Duration)})
		}
		for _, n := range scenarios.Names() {
			sc, err := scenarios.Load(n)
			if err != nil {
				fmt.Fprintf(stderr, "sim: %v\n", err)
				return exitUsage
			}
			rows = append(rows, entry{n, firstSentence(sc.Description), time.Duration(sc.Duration)})
		}
		width := 0
		for _, r := range rows {
			width = max(width, len(r.name))
		}
		for _, r := range rows {
			fmt.Fprintf(stdout, "%-*s %8v  %s\n", width, r.name, r.d, r.about)
		}
		return exitOK
	}
	if *out != "" {
		// Before the run, not after it: a directory that cannot be
		// written is a usage error found at once.
		if err := prepareOut(*out); err != nil {
			fmt.Fprintf(stderr, "sim: -out %s: %v\n", *out, err)
			return exitUsage
		}
	}
	if isScale(*name) {
		if *liveMode {
			fmt.Fprintf(stderr, "sim: %s is a scale scenario, which runs in virtual mode only; drop -live\n", *name)
			return exitUsage
		}
		return runScale(*name, *seed, *duration, *out, stdout, stderr)
	}
	sc, err := loadScenario(*name)
	if err != nil {
		fmt.Fprintf(stderr, "sim: %v\n", err)
		return exitUsage
	}
	opts := runner.Options{Seed: *seed, Duration: *duration}
	var o *runner.Outcome
	if *liveMode {
		lo := live.Options{Options: opts, Scale: *scale, Log: stderr}
		if *daemonLog != "" {
			f, err := os.Create(*daemonLog)
			if err != nil {
				fmt.Fprintf(stderr, "sim: -daemon-log: %v\n", err)
				return exitUsage
			}
			defer f.Close()
			lo.DaemonLog = f
		}
		o, err = live.Run(ctx, sc, lo)
	} else {
		o, err = runner.RunContext(ctx, sc, opts)
	}
	if errors.Is(err, runner.ErrInterrupted) {
		fmt.Fprintf(stderr, "sim: %v; nothing written\n", err)
		return exitInterrupted
	}
	if err != nil {
		fmt.Fprintf(stderr, "sim: %v\n", err)
		if errors.Is(err, scenario.ErrInvalid) {
			return exitUsage
		}
		return exitViolation
	}
	summary := report.Summary(o)
	fmt.Fprint(stdout, summary)
	if *out != "" {
		if err := writeOutputs(*out, o, summary); err != nil {
			fmt.Fprintf(stderr, "sim: %v\n", err)
			return exitUsage
		}
		fmt.Fprintf(stderr, "sim: report in %s\n", filepath.Join(*out, "report.html"))
	}
	fmt.Fprintf(stderr, "sim: %v simulated in %v wall, %d events\n", o.Result.Duration, o.Wall.Round(time.Millisecond), o.Counters.Events)
	return exitCode(o)
}

// exitCode is the process status for an outcome.
func exitCode(o *runner.Outcome) int {
	switch {
	case !o.InvariantsHold():
		return exitViolation
	case !o.Pass():
		return exitMissed
	}
	return exitOK
}

// isScale says whether name is a scale scenario: a shipped one, or a file
// whose kind is scale.
func isScale(name string) bool {
	if strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml") || strings.ContainsRune(name, os.PathSeparator) {
		return scalesim.IsScaleFile(name)
	}
	return scalesim.Shipped(name)
}

// runScale runs a scale scenario (package sim/scale) and writes its
// summary.txt and scale.csv to out.
func runScale(name string, seed uint64, duration time.Duration, out string, stdout, stderr io.Writer) int {
	spec, err := scalesim.Load(name)
	if err != nil {
		fmt.Fprintf(stderr, "sim: %v\n", err)
		return exitUsage
	}
	if seed != 0 {
		spec.Seed = seed
	}
	res, err := scalesim.Run(spec, scalesim.Options{Duration: duration})
	if err != nil {
		fmt.Fprintf(stderr, "sim: %v\n", err)
		return exitUsage
	}
	summary := res.Summary()
	fmt.Fprint(stdout, summary)
	if out != "" {
		if err := clearOut(out); err != nil {
			fmt.Fprintf(stderr, "sim: %v\n", err)
			return exitUsage
		}
		if err := os.WriteFile(filepath.Join(out, "summary.txt"), []byte(summary), 0o644); err != nil {
			fmt.Fprintf(stderr, "sim: %v\n", err)
			return exitUsage
		}
		f, err := os.Create(filepath.Join(out, "scale.csv"))
		if err == nil {
			err = res.WriteCSV(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err == nil {
			err = writeManifest(out, []string{"summary.txt", "scale.csv"})
		}
		if err != nil {
			fmt.Fprintf(stderr, "sim: write scale.csv: %v\n", err)
			return exitUsage
		}
		fmt.Fprintf(stderr, "sim: summary and CSV in %s\n", out)
	}
	fmt.Fprintf(stderr, "sim: %s", res.WallSummary())
	if !res.Oracle.Holds() {
		return exitViolation
	}
	return exitOK
}

func loadScenario(name string) (*scenario.Scenario, error) {
	if strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml") || strings.ContainsRune(name, os.PathSeparator) {
		return scenario.Load(name)
	}
	if _, err := scenarios.Source(name); err != nil {
		all := append(scenarios.Names(), scalesim.Names()...)
		sort.Strings(all)
		return nil, fmt.Errorf("%w: no shipped scenario %q (have %s)", scenario.ErrInvalid, name, strings.Join(all, ", "))
	}
	return scenarios.Load(name)
}

func firstSentence(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}

// manifest is the file in an output directory listing the files the last
// run wrote there, one path a line, so the next run into it removes them
// (the charts of keys it no longer focuses on) and nothing else.
const manifest = ".sim-files"

// prepareOut makes the output directory, or checks the one there is a
// directory, before the run.
func prepareOut(dir string) error {
	if info, err := os.Stat(dir); err == nil && !info.IsDir() {
		return fmt.Errorf("exists and is not a directory")
	}
	return os.MkdirAll(dir, 0o755)
}

// clearOut removes the files the manifest in dir names: those a previous
// run wrote (only the names a run writes: summary.txt, report.html,
// timeseries.csv, scale.csv and charts/*.svg).
func clearOut(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, manifest))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, name := range strings.Split(string(data), "\n") {
		if !written(name) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, filepath.FromSlash(name))); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return os.Remove(filepath.Join(dir, manifest))
}

// written says whether name (slash-separated) is a file a run writes.
func written(name string) bool {
	switch name {
	case "summary.txt", "report.html", "timeseries.csv", "scale.csv":
		return true
	}
	chart, ok := strings.CutPrefix(name, "charts/")
	return ok && strings.HasSuffix(chart, ".svg") && filepath.IsLocal(chart) && !strings.ContainsAny(chart, `/\`)
}

// writeManifest lists names (slash-separated) in dir's manifest.
func writeManifest(dir string, names []string) error {
	return os.WriteFile(filepath.Join(dir, manifest), []byte(strings.Join(names, "\n")+"\n"), 0o644)
}

func writeOutputs(dir string, o *runner.Outcome, summary string) error {
	if err := clearOut(dir); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "charts"), 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	names := []string{"summary.txt", "report.html", "timeseries.csv"}
	write := func(name string, f func(io.Writer) error) error {
		file, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
		if err := f(file); err != nil {
			file.Close()
			return fmt.Errorf("write %s: %w", name, err)
		}
		return file.Close()
	}
	if err := write("summary.txt", func(w io.Writer) error { _, err := io.WriteString(w, summary); return err }); err != nil {
		return err
	}
	if err := write("report.html", func(w io.Writer) error { return report.WriteHTML(w, o) }); err != nil {
		return err
	}
	if err := write("timeseries.csv", func(w io.Writer) error { return report.WriteCSV(w, o) }); err != nil {
		return err
	}
	ids, svgs := report.Charts(o)
	for _, id := range ids {
		svg := svgs[id]
		if err := write(filepath.Join("charts", id+".svg"), func(w io.Writer) error { _, err := io.WriteString(w, svg); return err }); err != nil {
			return err
		}
		names = append(names, "charts/"+id+".svg")
	}
	return writeManifest(dir, names)
}
