package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/dynrunner/dynrunner/launcher"
)

// runLauncher runs one single-use VM (microvm-runner-launch): `dynrunner launcher --flags`, every
// flag also from launcher.EnvName(flag) (the vm worker passes everything through the
// environment). It exits by itself with launcher.ExitCode: 0 only when the guest powered off
// by itself and did not say it failed (6 when it did), else non-zero with the reason on
// stderr, starting with "dynrunner launcher: ".
// Logs are JSON on stderr (LOG_FORMAT=console for humans, LOG_LEVEL).
func runLauncher(ctx context.Context, args []string, getenv func(string) string) error {
	s, err := parseLauncher(args, getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		launcherExit(err)
	}
	log, err := newLogger(os.Stderr, s.logFormat, s.logLevel, "launcher")
	if err != nil {
		launcherExit(fmt.Errorf("%w: %w", err, launcher.ErrInvalidConfig))
	}
	launcherExit(launcher.Launch(ctx, s.vm, log))
	return nil
}

// launcherSettings is the configuration of `dynrunner launcher`: its VM and its logging.
type launcherSettings struct {
	vm                  launcher.Config
	logFormat, logLevel string
}

// parseLauncher reads the launcher's configuration from its flags and getenv
// (launcher.ParseFlags), and LOG_FORMAT and LOG_LEVEL.
func parseLauncher(args []string, getenv func(string) string, out io.Writer) (launcherSettings, error) {
	s := launcherSettings{logFormat: cmp.Or(getenv("LOG_FORMAT"), "json"), logLevel: cmp.Or(getenv("LOG_LEVEL"), "info")}
	var err error
	s.vm, err = launcher.ParseFlags(args, getenv, out)
	return s, err
}

// launcherExit ends the process with the launcher's exit code. It does not return an error to
// main, which would turn a stop by SIGTERM (a cancelled context) into exit code 0.
func launcherExit(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "dynrunner launcher: %s\n", strings.TrimPrefix(err.Error(), "launcher: "))
	}
	os.Exit(launcher.ExitCode(err))
}
