// Package flagenv lets every flag of a FlagSet be set from the environment:
// flag "redis-addr" of program prefix SLUICE reads SLUICE_REDIS_ADDR. A flag
// given on the command line wins over the environment, which wins over the
// default.
package flagenv

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// EnvName is the variable that overrides flag name under prefix.
func EnvName(prefix, name string) string {
	return prefix + "_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
}

// VersionFlag is the flag every command prints its version with. It is
// never read from the environment: a SLUICE_VERSION set for another reason
// (an image or release tag) must not turn a daemon into a version printer.
const VersionFlag = "version"

// Parse parses args into fs, then applies environment overrides for every
// flag not set on the command line (but VersionFlag). getenv is usually
// os.Getenv.
func Parse(fs *flag.FlagSet, prefix string, args []string, getenv func(string) string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if getenv == nil {
		getenv = os.Getenv
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil || f.Name == VersionFlag {
			return
		}
		env := EnvName(prefix, f.Name)
		if v := getenv(env); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s=%q: %w", env, v, e)
			}
		}
	})
	return err
}

// Usage appends the environment variable to every flag's usage text (but
// VersionFlag's).
func Usage(fs *flag.FlagSet, prefix string) {
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == VersionFlag {
			return
		}
		f.Usage += " (env " + EnvName(prefix, f.Name) + ")"
	})
}
