package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/rs/zerolog"
)

// stopGrace is how long the hypervisor gets after SIGTERM before SIGKILL.
const stopGrace = 5 * time.Second

// Run boots the VM and blocks until it ends. It returns nil when the guest powered off by
// itself (the hypervisor exited with status 0) and `dynrunner guest` did not say it failed
// (guestFailure), ErrGuestFailed when it did, an error wrapping ErrDeadline when the VM ran
// past Config.Deadline, ErrStopped when ctx was cancelled, and ErrHypervisorFailed when the
// hypervisor exited otherwise. In the last three cases the hypervisor is killed (SIGTERM, then
// SIGKILL after 5 s). The hypervisor runs in its own process group with a parent-death signal
// of SIGKILL and an environment of its own (nothing of the launcher's), its stdout and stderr
// going to hypervisor.log in the instance directory. Run does not clean up: call Close.
func (i *Instance) Run(ctx context.Context) error {
	argv, err := i.hv.Command(i.Spec())
	if err != nil {
		return err
	}
	path, err := lookPath(argv[0])
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(filepath.Join(i.dir, hvLogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("launcher: %w", err)
	}
	defer logf.Close()
	cmd := &exec.Cmd{
		Path:        path,
		Args:        argv,
		Env:         childEnv,
		Dir:         i.dir,
		Stdout:      logf,
		Stderr:      logf,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}
	deadline := time.NewTimer(i.cfg.Deadline)
	defer deadline.Stop()
	started := time.Now()
	done, err := startChild(cmd)
	if err != nil {
		return fmt.Errorf("launcher: start %s: %w", i.hv.Name(), err)
	}
	pid := cmd.Process.Pid
	i.log.Info().Int("pid", pid).Strs("argv", argv).Msg("vm started")

	var why error
	select {
	case err := <-done:
		return i.exited(cmd, err, time.Since(started))
	case <-deadline.C:
		why = fmt.Errorf("launcher: the vm ran longer than --deadline %s: %w", i.cfg.Deadline, ErrDeadline)
	case <-ctx.Done():
		why = fmt.Errorf("launcher: %w (%s)", ErrStopped, context.Cause(ctx).Error())
	}
	i.log.Warn().Err(why).Int("pid", pid).Msg("killing the vm")
	if err := stopGroup(pid, done); err != nil {
		return errors.Join(why, err)
	}
	return why
}

// exited classifies the end of a hypervisor the launcher did not stop.
func (i *Instance) exited(cmd *exec.Cmd, err error, ran time.Duration) error {
	ps := cmd.ProcessState
	log := i.log.Info().Dur("ran", ran)
	if ps != nil && ps.Success() {
		if failed := guestFailure(i.SerialLog()); failed != "" {
			log.Str("guest", failed).Msg("the guest powered off after it failed")
			return fmt.Errorf("launcher: %w: %s", ErrGuestFailed, failed)
		}
		log.Msg("the guest powered off")
		return nil
	}
	tail := lastLines(filepath.Join(i.dir, hvLogFile), 5)
	var how string
	switch {
	case ps == nil:
		how = fmt.Sprintf("lost: %v", err)
	case ps.Sys().(syscall.WaitStatus).Signaled():
		how = "killed by " + ps.Sys().(syscall.WaitStatus).Signal().String()
	default:
		how = fmt.Sprintf("exit status %d", ps.ExitCode())
	}
	log.Str("how", how).Str("output", tail).Msg("hypervisor failed")
	if tail != "" {
		how += ": " + tail
	}
	return fmt.Errorf("launcher: %s %s: %w", i.hv.Name(), how, ErrHypervisorFailed)
}

// GuestMarker starts the line `dynrunner guest` writes to the serial console last, before it
// powers the VM off: GuestDone when it ran its job, else its error.
const (
	GuestMarker = "dynrunner guest: "
	GuestDone   = GuestMarker + "done"
)

// guestTail is how much of the serial console's end guestFailure reads, and guestSaid how much
// of the guest's line it passes on.
const (
	guestTail = 64 << 10
	guestSaid = 512
)

// guestFailure returns what `dynrunner guest` said failed, from the last GuestMarker line in the
// end of the serial console log p; "" when that line is GuestDone, or there is none (an image
// whose guest does not write one; a line the power-off cut short counts as none). The console
// is the guest's, so the line is untrusted: a job that writes such a line changes only its own
// environment's outcome (as a job that kills its runner does), and the guest, PID 1, kills
// every other process before it writes its own. What is returned is printable and at most
// guestSaid bytes.
func guestFailure(p string) string {
	b, err := readTail(p, guestTail)
	if err != nil {
		return ""
	}
	// Only whole lines: one the power-off cut short (`dynrunner guest: do`) says nothing.
	if end := bytes.LastIndexByte(b, '\n'); end >= 0 {
		b = b[:end]
	} else {
		b = nil
	}
	last := ""
	for l := range bytes.SplitSeq(b, []byte("\n")) {
		if _, after, ok := bytes.Cut(l, []byte(GuestMarker)); ok {
			last = string(after)
		}
	}
	last = strings.TrimSpace(strings.Map(func(r rune) rune {
		if !unicode.IsPrint(r) {
			return -1
		}
		return r
	}, last))
	if last == strings.TrimPrefix(GuestDone, GuestMarker) {
		return ""
	}
	if len(last) > guestSaid {
		last = strings.ToValidUTF8(last[:guestSaid], "") + "..."
	}
	return last
}

// stopGroup sends SIGTERM to process group pgid, and SIGKILL after stopGrace, until done
// reports the leader's exit. Members other than the leader are SIGKILLed then too.
func stopGroup(pgid int, done <-chan error) error {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case err := <-done:
		_ = err // the exit status of a hypervisor that was told to stop says nothing
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return nil
	case <-t.C:
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	t.Reset(10 * time.Second)
	select {
	case err := <-done:
		_ = err
		return nil
	case <-t.C:
		return fmt.Errorf("launcher: hypervisor %d survived SIGKILL", pgid)
	}
}

// readTail reads at most the last n bytes of the file p.
func readTail(p string, n int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		if _, err := f.Seek(st.Size()-n, io.SeekStart); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, n))
}

// lastLines returns up to n last non-empty lines of the file p, joined with " | ".
func lastLines(p string, n int) string {
	b, err := readTail(p, 8192)
	if err != nil {
		return ""
	}
	var lines []string
	for l := range bytes.SplitSeq(b, []byte("\n")) {
		if s := strings.TrimSpace(string(l)); s != "" {
			lines = append(lines, s)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Launch is the whole life of one VM, as `dynrunner launcher` runs it: Sweep the root of dead
// instances, Prepare, Run, and Close on every path. Its error maps to the exit code with
// ExitCode; nil means the guest powered off by itself.
func Launch(ctx context.Context, cfg Config, log zerolog.Logger) (err error) {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := Sweep(ctx, cfg.Root, log); err != nil {
		log.Warn().Err(err).Msg("sweep")
	}
	inst, err := Prepare(ctx, cfg, log)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, ErrInvalidConfig) {
			return fmt.Errorf("launcher: %w during preparation: %w", ErrStopped, err)
		}
		return err
	}
	defer func() {
		if cerr := inst.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("launcher: cleanup: %w", cerr))
		}
	}()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("launcher: %w (%s)", ErrStopped, context.Cause(ctx).Error())
	}
	return inst.Run(ctx)
}
