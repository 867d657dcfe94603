package redisproc

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the child when this process dies, so
// a development cluster or a test killed with SIGKILL (no clean-up runs)
// leaves no redis-server behind. The signal follows the thread that
// started the child; Go keeps that thread for the process's life unless
// a goroutine locked to it exits, which Start never does.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
