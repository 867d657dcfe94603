package flagenv

import (
	"errors"
	"log/slog"
	"os"
	"strings"
)

// List splits a comma-separated flag value (etcd endpoints, addresses),
// dropping blanks.
func List(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// Logger builds the text logger on stderr every daemon uses, at the level
// named by a -log-level flag (debug, info, warn or error).
func Logger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, errors.New("log level " + level + ": want debug, info, warn or error")
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
