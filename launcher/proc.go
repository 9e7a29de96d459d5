package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/dynrunner/dynrunner/internal/envlock"
	"github.com/dynrunner/dynrunner/internal/procfs"
)

// childEnv is the whole environment of every program the launcher runs: nothing of the
// launcher's own (which may hold the nonce) is inherited.
var childEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}

// lookPath resolves a program in childEnv's PATH (and the launcher's own, for tests and
// unusual installs).
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range strings.Split(strings.TrimPrefix(childEnv[0], "PATH="), ":") {
		p := dir + "/" + name
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("launcher: %s not found in PATH: %w", name, exec.ErrNotFound)
}

// startChild starts cmd with a parent-death signal of SIGKILL. The signal fires when the
// thread that forked the child ends, so the fork happens on a goroutine locked to its thread
// until the child has been waited for. It returns a channel receiving Wait's result.
func startChild(cmd *exec.Cmd) (<-chan error, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	started := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return done, nil
}

// run runs a helper program (qemu-img, genisoimage, ip) with argv only and childEnv. On
// failure the error holds the program's output. Cancelling ctx kills the program.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return runInput(ctx, "", name, args...)
}

// runInput is run with stdin as the program's standard input.
func runInput(ctx context.Context, stdin, name string, args ...string) ([]byte, error) {
	path, err := lookPath(name)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	cmd := &exec.Cmd{Path: path, Args: append([]string{name}, args...), Env: childEnv, Stdin: strings.NewReader(stdin), Stdout: &out, Stderr: &out}
	done, err := startChild(cmd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		return out.Bytes(), fmt.Errorf("%s: %w", name, errors.Join(ctx.Err(), <-done))
	}
	if err != nil {
		msg := strings.TrimSpace(out.String())
		if len(msg) > 2000 {
			msg = msg[:2000] + "..."
		}
		if msg == "" {
			return out.Bytes(), fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return out.Bytes(), nil
}

// flock applies flock(2) to f.
func flock(f *os.File, how int) error { return envlock.Flock(f, how) }

// procsWithArgPrefix lists the processes (zombies left out) one of whose arguments contains
// prefix: the hypervisor of an instance names files inside the instance directory.
func procsWithArgPrefix(prefix string) []int {
	procs, err := procfs.Running()
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, p := range procs {
		if p.PID > 1 && p.PID != self && childHasArg(p.PID, p.Stat, prefix) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// childComms are the command names (comm, at most 15 bytes) of the programs the launcher
// starts with instance files as arguments. Only those are stragglers: an operator's
// `tail serial.log` is not.
var childComms = []string{"qemu", "cloud-hyperviso", "genisoimage"}

// procHasArg reports whether pid runs (is no zombie), is one of childComms and has an argument
// containing s.
func procHasArg(pid int, s string) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && !st.Exited() && childHasArg(pid, st, s)
}

// childHasArg reports whether pid, whose stat is st, is one of childComms and has an argument
// containing s.
func childHasArg(pid int, st procfs.Stat, s string) bool {
	if !slices.ContainsFunc(childComms, func(c string) bool { return strings.HasPrefix(st.Comm, c) }) {
		return false
	}
	args, err := procfs.Cmdline(pid)
	return err == nil && slices.ContainsFunc(args, func(arg string) bool { return strings.Contains(arg, s) })
}

// killStragglers SIGKILLs every process with an argument containing marker and waits until
// they are gone, up to wait. Each process is signalled through a pidfd opened before its
// arguments are checked again, so a reused pid is never hit.
func killStragglers(ctx context.Context, marker string, wait time.Duration) (int, error) {
	pids := procsWithArgPrefix(marker)
	for _, pid := range pids {
		p, err := os.FindProcess(pid)
		if err != nil {
			continue
		}
		if procHasArg(pid, marker) {
			_ = p.Signal(syscall.SIGKILL)
		}
		_ = p.Release()
	}
	if len(pids) == 0 {
		return 0, nil
	}
	deadline := time.Now().Add(wait)
	for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 100*time.Millisecond) {
		left := procsWithArgPrefix(marker)
		if len(left) == 0 {
			return len(pids), nil
		}
		if time.Now().After(deadline) {
			return len(pids), fmt.Errorf("launcher: processes %v survived SIGKILL", left)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return len(pids), ctx.Err()
		}
	}
}
