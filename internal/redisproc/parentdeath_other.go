//go:build !linux

package redisproc

import "os/exec"

// dieWithParent does nothing where the kernel cannot tie a child's life
// to its parent's: a killed parent leaves its redis-server running.
func dieWithParent(*exec.Cmd) {}
