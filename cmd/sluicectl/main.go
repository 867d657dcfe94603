package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/term"

	"github.com/sluicehq/sluice/internal/stopsignal"
	"github.com/sluicehq/sluice/internal/version"
)

func main() {
	ctx, stop := stopsignal.NotifyContext(context.Background())
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one sluicectl command and returns its exit code. Global
// flags not given on the command line are read from the process
// environment.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-version" || args[0] == "--version") {
		fmt.Fprintln(stdout, version.String("sluicectl"))
		return exitOK
	}
	a := &app{
		stdin:           stdin,
		stdout:          stdout,
		stderr:          stderr,
		getenv:          os.Getenv,
		stdinIsTerminal: func() bool { return isTerminal(stdin) },
	}
	return a.run(ctx, args)
}

// isTerminal reports whether r is a terminal, where a person can answer a
// prompt. Any other character device (/dev/null) is not one.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
