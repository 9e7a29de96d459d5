package launcher

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers branch on them with errors.Is; ExitCode maps them to the exit codes
// of `dynrunner launcher`.
var (
	// ErrInvalidConfig: a flag or value was refused (exit code 2).
	ErrInvalidConfig = errors.New("invalid configuration")
	// ErrInstanceExists: the directory of the instance already exists, owned by a live launcher
	// (exit code 1).
	ErrInstanceExists = errors.New("instance already exists")
	// ErrDeadline: the VM ran past Config.Deadline and was killed (exit code 3).
	ErrDeadline = errors.New("deadline exceeded")
	// ErrStopped: the launcher was stopped (its context was cancelled, for the command: SIGTERM or
	// SIGINT) and killed the VM (exit code 4).
	ErrStopped = errors.New("stopped")
	// ErrHypervisorFailed: the hypervisor exited with a non-zero status or was killed by a signal
	// the launcher did not send (exit code 5).
	ErrHypervisorFailed = errors.New("hypervisor failed")
	// ErrGuestFailed: the guest powered off by itself after `dynrunner guest` failed, as the last
	// line it wrote to the serial console says (GuestMarker; exit code 6).
	ErrGuestFailed = errors.New("guest failed")
	// ErrNoDirectIO: the file system of the instance directory or of the image refuses O_DIRECT
	// (exit code 1).
	ErrNoDirectIO = errors.New("file system refuses O_DIRECT")
)

// Exit codes of `dynrunner launcher`.
const (
	ExitPoweroff   = 0 // the guest powered off by itself
	ExitFailure    = 1 // preparation or cleanup failed
	ExitInvalid    = 2 // invalid flags or values
	ExitDeadline   = 3 // the deadline killed the VM
	ExitStopped    = 4 // SIGTERM/SIGINT stopped the launcher, which killed the VM
	ExitHypervisor = 5 // the hypervisor failed (non-zero exit, or killed by someone else)
	ExitGuest      = 6 // the guest powered off after `dynrunner guest` failed
)

// ExitCode maps an error of Launch to the launcher's exit code: 0 for nil (the guest powered
// off by itself), else one of the Exit* codes.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitPoweroff
	case errors.Is(err, ErrInvalidConfig):
		return ExitInvalid
	case errors.Is(err, ErrDeadline):
		return ExitDeadline
	case errors.Is(err, ErrStopped):
		return ExitStopped
	case errors.Is(err, ErrHypervisorFailed):
		return ExitHypervisor
	case errors.Is(err, ErrGuestFailed):
		return ExitGuest
	default:
		return ExitFailure
	}
}

// invalidf returns an ErrInvalidConfig error: "launcher: <what>: invalid configuration".
func invalidf(format string, args ...any) error {
	return fmt.Errorf("launcher: %s: %w", fmt.Sprintf(format, args...), ErrInvalidConfig)
}
