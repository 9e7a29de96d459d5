package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dynrunner/dynrunner/guest"
	"github.com/dynrunner/dynrunner/launcher"
)

// runGuest runs inside a microVM: one job, then power off.
func runGuest(ctx context.Context, args []string, getenv func(string) string) error {
	s, err := parseGuest(args, getenv)
	if err != nil {
		return err
	}
	log, err := newLogger(os.Stderr, "json", "info", "guest")
	if err != nil {
		return err
	}
	s.cfg.Env, s.cfg.Output, s.cfg.Log = os.Environ(), os.Stdout, log
	err = guest.Run(ctx, s.cfg)
	// The last line on the console (stderr) says how the guest ended: a launcher that sees the
	// VM power off reads it (launcher.GuestMarker) to tell a failure from a job that ran. As
	// PID 1 the guest first ends every other process, so nothing the job left writes after it,
	// and lets the console send the line before the power-off.
	if s.poweroff && os.Getpid() == 1 {
		endOthers(2 * time.Second)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "\n%s%s\n", launcher.GuestMarker, strings.ReplaceAll(err.Error(), "\n", "; "))
	} else {
		fmt.Fprintf(os.Stderr, "\n%s\n", launcher.GuestDone)
	}
	if s.poweroff {
		_ = unix.IoctlSetInt(int(os.Stderr.Fd()), unix.TCSBRK, 1) // tcdrain; fails harmlessly on a non-terminal
		syscall.Sync()
		if perr := syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF); perr != nil {
			return fmt.Errorf("power off: %w", perr)
		}
	}
	return err
}

// endOthers kills every process but PID 1 (the caller) and reaps them, for at most limit.
func endOthers(limit time.Duration) {
	_ = syscall.Kill(-1, syscall.SIGKILL)
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.ECHILD):
			return // none left
		case err == nil && pid > 0:
			continue // reaped one; there may be more
		}
		time.Sleep(10 * time.Millisecond) // killed ones not yet exited
	}
}

// guestSettings is the configuration of `dynrunner guest`.
type guestSettings struct {
	cfg      guest.Config
	poweroff bool
}

// parseGuest reads the guest's flags and, from getenv, the seed a sandbox API passes
// (guest.SeedFromEnv).
func parseGuest(args []string, getenv func(string) string) (guestSettings, error) {
	fs := flag.NewFlagSet("guest", flag.ContinueOnError)
	seed := fs.String("seed-dir", "/run/dynrunner/seed", "directory of the mounted NoCloud seed (meta-data)")
	work := fs.String("work-dir", "/var/lib/dynrunner-guest", "work directory of the runner and the job")
	runAs := fs.String("user", "", "account the runner and its job run as (the guest image's runner); empty: the guest's own")
	poweroff := fs.Bool("poweroff", os.Getpid() == 1, "power the VM off when the job ends (default when running as PID 1 with a NoCloud seed)")
	if err := fs.Parse(args); err != nil {
		return guestSettings{}, err
	}
	s := guestSettings{cfg: guest.Config{SeedDir: *seed, WorkDir: *work, User: *runAs}, poweroff: *poweroff}
	// A sandbox API (OpenSandbox) seeds the guest through its environment; its entry process
	// may be PID 1 of a Kata pod, which the sandbox's end tears down: exit instead of powering off.
	envSeed, fromEnv, err := guest.SeedFromEnv(getenv)
	if err != nil {
		return guestSettings{}, err
	}
	if fromEnv {
		s.cfg.Seed = &envSeed
		if !flagSet(fs, "poweroff") {
			s.poweroff = false
		}
	}
	return s, nil
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
