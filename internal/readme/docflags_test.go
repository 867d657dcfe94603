package readme

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestDocumentedFlagsExist checks that every flag the docs name in code
// (`-name`, `-name value`, `-name=value`) is a flag of a shipped command:
// global, regional, agent, one of sluicectl's commands, or the image
// builder. A flag the docs tell an operator to set that no command has
// sends them looking for a knob that is not there.
func TestDocumentedFlagsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every command")
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator), "./cmd/...", "./scripts/imagebuild")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	flags := map[string]bool{}
	help := func(name string, args ...string) string {
		out, _ := exec.Command(filepath.Join(bin, name), append(args, "-h")...).CombinedOutput()
		for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(out), -1) {
			flags[m[1]] = true
		}
		return string(out)
	}
	for _, name := range []string{"global", "regional", "agent", "imagebuild"} {
		help(name)
	}
	var commands []string
	_, list, _ := strings.Cut(help("sluicectl"), "\ncommands:\n")
	list, _, _ = strings.Cut(list, "\n\n")
	for _, line := range strings.Split(list, "\n") {
		if !strings.HasPrefix(line, "  ") || strings.HasPrefix(line, "   ") {
			continue // a continuation
		}
		words := strings.Fields(line)
		cmd := words[:1]
		if len(words) > 1 && regexp.MustCompile(`^[a-z][a-z-]*$`).MatchString(words[1]) {
			cmd = words[:2]
		}
		commands = append(commands, strings.Join(cmd, " "))
	}
	if len(commands) < 10 {
		t.Fatalf("sluicectl's usage lists %d commands: %q", len(commands), commands)
	}
	for _, c := range commands {
		help("sluicectl", strings.Fields(c)...)
	}
	if !flags["etcd-endpoints"] || !flags["want"] || !flags["ca-bundle"] {
		t.Fatalf("flags read from the commands' usage: %v", flags)
	}

	span := regexp.MustCompile("`-([a-z][a-z0-9-]*)[` =]")
	missing := map[string][]string{}
	for _, doc := range []string{"docs/operations.md", "docs/config.md", "docs/architecture.md"} {
		text, err := os.ReadFile(filepath.Join("../..", doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range span.FindAllStringSubmatch(string(text), -1) {
			if !flags[m[1]] {
				missing[m[1]] = append(missing[m[1]], doc)
			}
		}
	}
	names := make([]string, 0, len(missing))
	for name := range missing {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		t.Errorf("-%s, named in %s, is no flag of any command", name, strings.Join(missing[name], ", "))
	}
}
