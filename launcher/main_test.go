package launcher

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"github.com/rs/zerolog"
)

// childEnvVar makes the test binary act as `dynrunner launcher` (the command's main.go case
// lives with the lead): the integration tests re-exec it, configured through DYNRUNNER_LAUNCH_*
// exactly as the vm worker configures the command, so they can SIGKILL and SIGTERM a real
// launcher process.
const childEnvVar = "DYNRUNNER_LAUNCHER_TEST_CHILD"

func TestMain(m *testing.M) {
	switch os.Getenv(childEnvVar) {
	case "1":
		os.Exit(childLauncher())
	case "hang":
		// A stand-in for a hypervisor that outlived its launcher (see TestSweep).
		select {}
	}
	code := m.Run()
	if imageDir != "" {
		_ = os.RemoveAll(imageDir)
	}
	os.Exit(code)
}

// childLauncher mirrors cmd/dynrunner/launcher.go.
func childLauncher() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := ParseFlags(nil, os.Getenv, os.Stderr)
	if err == nil {
		log := zerolog.New(os.Stderr).With().Timestamp().Str("component", "launcher").Logger()
		err = Launch(ctx, cfg, log)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "dynrunner launcher: %s\n", strings.TrimPrefix(err.Error(), "launcher: "))
	}
	return ExitCode(err)
}
