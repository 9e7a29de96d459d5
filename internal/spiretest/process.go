package spiretest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a process group gets between SIGTERM and SIGKILL.
const stopGrace = 10 * time.Second

// process is spire-server or spire-agent running until stop, its output in a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	err     error         // the result of Wait, valid after done
	once    sync.Once
}

func startProcess(name, logPath, bin string, args ...string) (*process, error) {
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
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady polls ready until it succeeds, the process exits or timeout passes.
func (p *process) waitReady(ctx context.Context, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for pause := 50 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-p.done:
			err := fmt.Errorf("%s exited during start-up (%w); last output:\n%s", p.name, p.err, p.tail())
			if bytes.Contains(p.tailBytes(), []byte("address already in use")) {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %v: %w; last output:\n%s", p.name, timeout, last, p.tail())
		case <-time.After(pause):
		}
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after stopGrace, and waits for the
// exit. It is idempotent.
func (p *process) stop() {
	p.once.Do(func() {
		_ = signalGroup(p.cmd.Process, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			_ = signalGroup(p.cmd.Process, syscall.SIGKILL)
			<-p.done
		}
	})
}

// tail returns the end of the process's log.
func (p *process) tail() string { return string(p.tailBytes()) }

func (p *process) tailBytes() []byte {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return []byte(err.Error())
	}
	const max = 8 << 10
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return b
}
