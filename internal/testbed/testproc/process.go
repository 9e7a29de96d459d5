// Package testproc runs the servers integration tests start as child processes (etcd,
// kube-apiserver, spire-server, spire-agent): each in a process group of its own, its output in
// a log file, polled until ready, stopped with SIGTERM and then SIGKILL, and killed with the
// test binary when that dies first.
package testproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// StopGrace is how long a process group gets between SIGTERM and SIGKILL.
const StopGrace = 10 * time.Second

// tailMax bounds Tail.
const tailMax = 8 << 10

// ErrPortTaken reports a process that exited during start-up saying "address already in use":
// another process took a port chosen free a moment earlier. Callers retry with new ports.
var ErrPortTaken = errors.New("port taken")

// Process is a server running until Stop, its output in LogPath.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	err     error         // the result of Wait, valid after done
	once    sync.Once
}

// Start runs bin with args, appending its output to logPath.
func Start(name, logPath, bin string, args ...string) (*Process, error) {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer out.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// WaitReady polls ready (50 ms doubling to 1 s) until it succeeds, the process exits or
// timeout passes. An exit for a taken port wraps ErrPortTaken.
func (p *Process) WaitReady(ctx context.Context, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-p.done:
			err := fmt.Errorf("%s exited during start-up (%w); last output:\n%s", p.Name, p.err, p.Tail())
			if bytes.Contains(p.tailBytes(), []byte("address already in use")) {
				err = fmt.Errorf("%w: %w", ErrPortTaken, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v: %w; last output:\n%s", p.Name, timeout, last, p.Tail())
		case <-time.After(pause):
		}
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after StopGrace, and waits for the
// exit. It is idempotent.
func (p *Process) Stop() {
	p.once.Do(func() {
		_ = signalGroup(p.cmd.Process, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(StopGrace):
			_ = signalGroup(p.cmd.Process, syscall.SIGKILL)
			<-p.done
		}
	})
}

// Tail returns the end of the process's log.
func (p *Process) Tail() string { return string(p.tailBytes()) }

func (p *Process) tailBytes() []byte {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return []byte(err.Error())
	}
	if len(b) > tailMax {
		b = b[len(b)-tailMax:]
	}
	return b
}
