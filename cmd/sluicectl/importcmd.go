package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/sluicehq/sluice/pkg/config"
	"github.com/sluicehq/sluice/pkg/envoyrls/importer"
)

// importEnvoyCmd converts an envoyproxy/ratelimit config directory into
// envoy.domains trees and classes. The base is the config in etcd, and the
// result is written back there like apply (diff, confirmation, revision
// guard); with -o it is the -base file, and the result is written to a
// file or stdout with the diff on stderr, without etcd.
func (a *app) importEnvoyCmd(fs *flag.FlagSet) func(context.Context, []string) error {
	out := fs.String("o", "", `write the imported config to this file ("-" for stdout) instead of etcd; needs -base`)
	base := fs.String("base", "", "Sluice config file to add the limits to (with -o; without -o the base is the config in etcd)")
	var change changeFlags
	change.register(fs)
	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return exitf(exitUsage, "import envoy-ratelimit takes one directory (the files envoyproxy/ratelimit loads: *.yaml with domain and descriptors), got %d arguments", len(args))
		}
		if (*out == "") != (*base == "") {
			return exitf(exitUsage, "-o and -base go together: -o FILE -base FILE writes a file from a file; neither reads and writes the config in etcd")
		}
		files, skipped, err := importer.ReadDir(args[0])
		if err != nil {
			return exitf(exitInvalid, "%v; nothing was written", err)
		}
		for _, s := range skipped {
			fmt.Fprintln(a.stderr, "note: "+s)
		}
		if *out != "" {
			current, err := a.readConfigFile(*base)
			if err != nil {
				return err
			}
			next, err := a.convert(current, files)
			if err != nil {
				return err
			}
			return a.writeImport(current, next, *out, change)
		}
		cli, store, err := a.etcd()
		if err != nil {
			return err
		}
		defer cli.Close()
		current, rev, err := a.currentConfig(ctx, store)
		if err != nil {
			return err
		}
		next, err := a.convert(current, files)
		if err != nil {
			return err
		}
		return a.commit(ctx, store, current, rev, next, change, false)
	}
}

func (a *app) convert(current *config.Config, files []importer.File) (*config.Config, error) {
	res, err := importer.Convert(current, files)
	if err != nil {
		fmt.Fprintln(a.stderr, "problems:")
		for _, l := range problemLines(err) {
			fmt.Fprintln(a.stderr, "  "+l)
		}
		if errors.Is(err, config.ErrInvalidConfig) {
			return nil, exitf(exitInvalid, "the imported config does not validate; nothing was written")
		}
		return nil, exitf(exitInvalid, "the envoy ratelimit config cannot be imported; nothing was written")
	}
	for _, n := range res.Notes {
		fmt.Fprintln(a.stderr, "note: "+n)
	}
	return res.Config, nil
}

// writeImport shows the diff on stderr and writes next to out ("-" is
// stdout).
func (a *app) writeImport(current, next *config.Config, out string, change changeFlags) error {
	data, err := next.Marshal()
	if err != nil {
		return exitf(exitInvalid, "render config: %v", err)
	}
	diff := config.Diff(current, next)
	if diff == "" {
		fmt.Fprintln(a.stderr, "no changes")
	}
	fmt.Fprint(a.stderr, diff)
	if change.dryRun {
		fmt.Fprintln(a.stderr, "dry run: nothing written")
		return nil
	}
	if out == "-" {
		_, err = a.stdout.Write(data)
		return err
	}
	if err := os.WriteFile(out, data, 0o644); err != nil {
		return exitf(exitInvalid, "write %s: %v", out, err)
	}
	fmt.Fprintf(a.stdout, "wrote %s\n", out)
	return nil
}
