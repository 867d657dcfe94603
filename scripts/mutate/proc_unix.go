//go:build unix

package main

import (
	"os/exec"
	"syscall"
	"time"
)

// setProcessGroup makes cancelling cmd end the test binary go test started
// as well, not only the go command.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
}
