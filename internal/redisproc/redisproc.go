// Package redisproc runs a Redis for development mode, the simulator's live
// mode and tests: a real redis-server child process on a free loopback port
// with persistence off, or, when redis-server is not installed and the
// caller allows it, an embedded Redis (miniredis) in the process.
package redisproc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// ErrNoRedisServer means redis-server is not on PATH.
var ErrNoRedisServer = errors.New("redis-server is not on PATH (apt-get install redis-server)")

// Proc is one Redis. Safe for concurrent use.
type Proc struct {
	port     int
	embedded bool
	extra    []string    // more redis-server arguments
	tls      *tls.Config // set: the server serves TLS only, checked with this client configuration

	mu     sync.Mutex           // guards cmd, exited, mini and out
	cmd    *exec.Cmd            // the child process, nil when stopped or embedded
	exited chan struct{}        // closed when cmd has exited
	mini   *miniredis.Miniredis // the embedded server, nil unless embedded
	out    *syncBuffer          // the child's output, for error messages
}

// syncBuffer is the child's output: written by exec's copying goroutine,
// read for error messages.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// errPortTaken is a start that lost its port to another process between
// finding it free and redis-server binding it.
var errPortTaken = errors.New("the port was taken before redis-server bound it")

// portAttempts bounds the ports StartWith tries.
const portAttempts = 5

// Start runs redis-server on a free port and waits until it answers. With
// allowEmbedded, a missing redis-server falls back to miniredis (check
// Embedded); without, it is ErrNoRedisServer.
func Start(allowEmbedded bool) (*Proc, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if !allowEmbedded {
			return nil, ErrNoRedisServer
		}
		return startEmbedded()
	}
	return StartWith()
}

// StartWith runs redis-server with more arguments (for example
// "--cluster-enabled", "yes"); it needs redis-server on PATH.
func StartWith(args ...string) (*Proc, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, ErrNoRedisServer
	}
	// A free port can be taken by another process (a listener, or an
	// outgoing connection's local port) before redis-server binds it: the
	// server then exits, and a fresh port is tried.
	var err error
	for range portAttempts {
		var port int
		if port, err = freePort(); err != nil {
			return nil, err
		}
		p := &Proc{port: port, extra: args}
		if err = p.start(); err == nil {
			return p, nil
		}
		if !errors.Is(err, errPortTaken) {
			return nil, err
		}
	}
	return nil, err
}

// Embedded reports whether this is the in-process fallback rather than a
// real redis-server.
func (p *Proc) Embedded() bool { return p.embedded }

// Addr is host:port; it stays the same across Stop and Restart.
func (p *Proc) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.port) }

// Stop kills the server as a crash would (no save). Idempotent.
func (p *Proc) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.embedded {
		if p.mini != nil {
			p.mini.Close()
			p.mini = nil
		}
		return
	}
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
}

// Pause stops the server's process (SIGSTOP), as a hung or descheduled
// Redis: connections stay open and nothing is answered until Resume. Not
// for the embedded server.
func (p *Proc) Pause() error { return p.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (p *Proc) Resume() error { return p.signal(syscall.SIGCONT) }

func (p *Proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.embedded || p.cmd == nil {
		return errors.New("redisproc: no redis-server process to signal")
	}
	return p.cmd.Process.Signal(sig)
}

// Restart starts the server again on the same port: empty, or loading the
// RDB file its arguments point it at (what the last SAVE wrote there).
func (p *Proc) Restart() error {
	p.Stop()
	if p.embedded {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr(p.Addr()); err != nil {
			return fmt.Errorf("restart embedded redis: %w", err)
		}
		p.mu.Lock()
		p.mini = m
		p.mu.Unlock()
		return nil
	}
	return p.start()
}

// inheritNothing marks, once, the descriptors this process inherited
// close-on-exec (Go opens its own that way). A go fuzz worker inherits its
// pipes to the fuzzing coordinator; a redis-server holding them would keep
// the coordinator waiting for them to close after the worker is gone.
var inheritNothing sync.Once

func closeInheritedOnExec() {
	for fd := 3; fd < 256; fd++ {
		syscall.CloseOnExec(fd)
	}
}

func (p *Proc) start() error {
	ports := []string{"--port", strconv.Itoa(p.port)}
	if p.tls != nil {
		ports = []string{"--port", "0", "--tls-port", strconv.Itoa(p.port)}
	}
	args := append(append(ports, "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--loglevel", "warning"), p.extra...)
	inheritNothing.Do(closeInheritedOnExec)
	cmd := exec.Command("redis-server", args...)
	dieWithParent(cmd)
	out := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited, p.out = cmd, exited, out
	p.mu.Unlock()

	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, TLSConfig: p.tls})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			p.mu.Lock()
			p.cmd = nil
			p.mu.Unlock()
			if strings.Contains(out.String(), "Address already in use") {
				return fmt.Errorf("redis-server on %s: %w", p.Addr(), errPortTaken)
			}
			return fmt.Errorf("redis-server on %s exited at start: %s", p.Addr(), out.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		// The server answering must be this child, not another process
		// that holds the port.
		info, err := c.InfoMap(ctx, "server").Result()
		cancel()
		if err == nil {
			if pid := info["Server"]["process_id"]; pid != strconv.Itoa(cmd.Process.Pid) {
				p.Stop()
				return fmt.Errorf("redis-server on %s: another process (pid %s) answers there: %w", p.Addr(), pid, errPortTaken)
			}
			return nil
		}
		if time.Now().After(deadline) {
			p.Stop()
			return fmt.Errorf("redis-server on %s did not answer within 10s: %v\n%s", p.Addr(), err, p.output())
		}
		time.Sleep(5 * time.Millisecond) // polling a process start-up with a deadline
	}
}

func (p *Proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.out == nil {
		return ""
	}
	return p.out.String()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startEmbedded() (*Proc, error) {
	m := miniredis.NewMiniRedis()
	if err := m.StartAddr("127.0.0.1:0"); err != nil {
		return nil, fmt.Errorf("start embedded redis: %w", err)
	}
	return &Proc{embedded: true, mini: m, port: m.Server().Addr().Port}, nil
}
