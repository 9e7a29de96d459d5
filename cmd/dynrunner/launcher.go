package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/dynrunner/dynrunner/launcher"
)

// runLauncher runs one single-use VM (microvm-runner-launch): `dynrunner launcher --flags`, every
// flag also from DYNRUNNER_LAUNCH_<FLAG> (the vm worker passes everything through the
// environment). It exits by itself with launcher.ExitCode: 0 only when the guest powered off
// by itself, else non-zero with the reason on stderr, starting with "dynrunner launcher: ".
// Logs are JSON on stderr (LOG_FORMAT=console for humans, LOG_LEVEL).
func runLauncher(ctx context.Context, args []string) error {
	cfg, err := launcher.ParseFlags(args, os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		launcherExit(err)
	}
	format, level := os.Getenv("LOG_FORMAT"), os.Getenv("LOG_LEVEL")
	if format == "" {
		format = "json"
	}
	if level == "" {
		level = "info"
	}
	log, err := newLogger(os.Stderr, format, level, "launcher")
	if err != nil {
		launcherExit(fmt.Errorf("%w: %w", err, launcher.ErrInvalidConfig))
	}
	launcherExit(launcher.Launch(ctx, cfg, log))
	return nil
}

// launcherExit ends the process with the launcher's exit code. It does not return an error to
// main, which would turn a stop by SIGTERM (a cancelled context) into exit code 0.
func launcherExit(err error) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "dynrunner launcher: %s\n", strings.TrimPrefix(err.Error(), "launcher: "))
	}
	os.Exit(launcher.ExitCode(err))
}
