package devforge

import (
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a child gets between SIGTERM and SIGKILL.
const stopGrace = 10 * time.Second

// process is a child process (gitea web, gitea-runner daemon) that runs until stop.
type process struct {
	name string
	cmd  *exec.Cmd
	tail *tailBuffer
	done chan struct{} // closed when the process has exited and its output is drained
	err  error         // the result of Wait, valid after done

	stopOnce sync.Once
	stopErr  error
}

// startProcess starts cmd in its own process group with stdout and stderr copied to out (may
// be nil) and remembered in a short tail for error messages.
func startProcess(name string, cmd *exec.Cmd, out io.Writer) (*process, error) {
	p := &process{name: name, cmd: cmd, tail: newTailBuffer(8 << 10), done: make(chan struct{})}
	w := io.Writer(p.tail)
	if out != nil {
		w = io.MultiWriter(p.tail, out)
	}
	cmd.Stdout = w
	cmd.Stderr = w
	cmd.SysProcAttr = sysProcAttr()
	// Output pipes may be held open by grandchildren (git); do not wait for them forever.
	cmd.WaitDelay = stopGrace
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("devforge: start %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended on its own.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitError describes how the process ended, with the tail of its output.
func (p *process) exitError() error {
	err := p.err
	if err == nil {
		err = errors.New("exit status 0")
	}
	return fmt.Errorf("devforge: %s exited (%w); last output:\n%s", p.name, err, p.tail.String())
}

// stop sends SIGTERM to the process group, then SIGKILL after stopGrace, and waits for the exit.
// It is idempotent. A process that ends because of the signal is not an error.
func (p *process) stop() error {
	p.stopOnce.Do(func() {
		if p.exited() {
			p.stopErr = exitErr(p.err)
			return
		}
		_ = signalGroup(p.cmd, syscall.SIGTERM)
		timer := time.NewTimer(stopGrace)
		defer timer.Stop()
		select {
		case <-p.done:
		case <-timer.C:
			_ = signalGroup(p.cmd, syscall.SIGKILL)
			<-p.done
		}
		var ee *exec.ExitError
		if p.err != nil && !errors.As(p.err, &ee) {
			p.stopErr = fmt.Errorf("devforge: stop %s: %w", p.name, p.err)
		}
	})
	return p.stopErr
}

func exitErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("devforge: process had already exited: %w", err)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
