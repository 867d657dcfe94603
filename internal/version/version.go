// Package version tells what a Sluice binary was built from: the module
// version and the VCS revision the Go toolchain stamps into every binary
// (debug.ReadBuildInfo), printed by each command's --version.
package version

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Info is what a binary knows of its own build.
type Info struct {
	// Version is the main module's version: a release tag (v0.2.0), a
	// pseudo-version for an untagged commit, with "+dirty" when the work
	// tree had changes, or "(devel)" when the toolchain could not tell.
	Version string
	// Revision is the VCS commit the binary was built from; "" when the
	// build had no VCS information (-buildvcs=false, no .git).
	Revision string
	// Time is the commit time of Revision (RFC 3339); "" without VCS.
	Time string
	// Modified says the work tree had uncommitted changes.
	Modified bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Read returns the running binary's build information.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "(unknown)"}
	}
	return FromBuildInfo(bi)
}

// FromBuildInfo extracts Info from a binary's build information (that of
// the running binary, or of another read with debug/buildinfo).
func FromBuildInfo(bi *debug.BuildInfo) Info {
	info := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if info.Version == "" {
		info.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is the one line --version prints, e.g.
//
//	regional v0.2.0 (revision 0123abcd…, 2026-12-01T16:30:00Z) go1.26.8
func (i Info) String(program string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", program, i.Version)
	var detail []string
	if i.Revision != "" {
		detail = append(detail, "revision "+i.Revision)
	}
	if i.Time != "" {
		detail = append(detail, i.Time)
	}
	if i.Modified {
		detail = append(detail, "modified")
	}
	if len(detail) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(detail, ", "))
	}
	if i.GoVersion != "" {
		fmt.Fprintf(&b, " %s", i.GoVersion)
	}
	return b.String()
}

// String is the --version line of the running binary.
func String(program string) string { return Read().String(program) }
