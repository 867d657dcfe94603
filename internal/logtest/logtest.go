// Package logtest collects a daemon's log output in tests, so a test reads
// what an operator's log would show while the daemon's goroutines still
// write to it.
package logtest

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer is an io.Writer for a logger (slog.NewTextHandler(&buf, ...)).
// Safe for concurrent use: loggers write from any goroutine while the test
// reads.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Count is how many times s was written so far (non-overlapping).
func (b *Buffer) Count(s string) int { return strings.Count(b.String(), s) }
