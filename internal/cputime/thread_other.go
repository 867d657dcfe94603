//go:build !linux

package cputime

import (
	"errors"
	"time"
)

// Thread is measured on Linux only; elsewhere it returns an error.
func Thread() (time.Duration, error) {
	return 0, errors.ErrUnsupported
}
