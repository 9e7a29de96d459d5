// Command dynrunner is dynrunner's one binary: the controller, the executor that runs inside
// environments, and operator commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `dynrunner — one-shot environments for Gitea Actions jobs

Usage:
  dynrunner controller      run the control plane (components from COMPONENTS, default all)
  dynrunner executor        run one job inside an environment (started by a pod worker)
  dynrunner launcher        boot one microVM for a job and clean everything up (used by the vm worker)
  dynrunner guest           run one job inside a microVM (reads the NoCloud seed), then power off
  dynrunner identity        register job Pods (or docker job containers) with SPIRE, one entry each, deleted when they end
  dynrunner events [--json] follow the audit streams: assignment transitions and Pod phases
  dynrunner status [--json] print every component alive and the live work: from NATS with NATS_URL, else from
                            the controller at HTTP_LISTEN; exits 1 when no scheduler or no facade is alive
  dynrunner drain [--undo] [--wait D] WORKER
                            cordon a worker (KIND.INSTANCE from status): it takes no new environment and
                            finishes its own; --wait D waits until it is safe to remove (controller at HTTP_LISTEN)
  dynrunner demo [--once]   start a local Gitea and a controller and run a sample workflow
  dynrunner version         print the version

Configuration comes from the environment; see docs/configuration.md.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd, args := os.Args[1], os.Args[2:]
	// The one place the environment is read: every subcommand parses its configuration
	// from getenv (docs/configuration.md; configdocs_test.go checks the two agree).
	getenv := os.Getenv
	var err error
	switch cmd {
	case "controller":
		err = runController(ctx, args, getenv)
	case "executor":
		err = runExecutor(ctx, args, getenv)
	case "launcher":
		err = runLauncher(ctx, args, getenv)
	case "guest":
		err = runGuest(ctx, args, getenv)
	case "identity":
		err = runIdentity(ctx, args, getenv)
	case "events":
		err = runEvents(ctx, args, getenv, os.Stdout)
	case "status":
		err = runStatus(ctx, args, getenv, os.Stdout)
	case "drain":
		err = runDrain(ctx, args, getenv, os.Stdout)
	case "demo":
		err = runDemo(ctx, args, getenv)
	case "version", "--version":
		fmt.Println("dynrunner", version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "dynrunner: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "dynrunner %s: %v\n", cmd, err)
		os.Exit(1)
	}
}

// newLogger builds the process logger: JSON by default, a console writer for humans.
func newLogger(w io.Writer, format, level, component string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("LOG_LEVEL %q: want trace, debug, info, warn or error", level)
	}
	switch format {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	default:
		return zerolog.Logger{}, fmt.Errorf("LOG_FORMAT %q: want json or console", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("component", component).Logger(), nil
}
