package redisproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv makes TestRedisDiesWithItsParent's helper run as the parent.
const childEnv = "SLUICE_REDISPROC_PARENT"

// TestRedisDiesWithItsParent: a process that started a redis-server and is
// then killed with SIGKILL (no clean-up runs, as `regional -dev` killed so)
// leaves no redis-server behind.
func TestRedisDiesWithItsParent(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		p, err := StartWith()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		p.mu.Lock()
		pid := p.cmd.Process.Pid
		p.mu.Unlock()
		fmt.Println("redis", pid)
		select {} // until killed
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	parent := exec.Command(exe, "-test.run=^TestRedisDiesWithItsParent$")
	parent.Env = append(os.Environ(), childEnv+"=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	defer parent.Wait()
	defer parent.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "redis ") {
		t.Fatalf("the parent's first line: %q, %v", line, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "redis ")))
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	parent.Wait()
	// The kernel signals the child as the parent dies; its exit is then
	// a matter of scheduling, polled with a deadline. Signal 0 reports
	// whether the process still exists (a zombie counts as gone: it was
	// reparented and is reaped by init).
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("redis-server %d still runs 30s after its parent was killed", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
}

// alive reports whether pid is a running (not zombie) process.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
