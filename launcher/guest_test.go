package launcher

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGuestFailure reads how `dynrunner guest` ended from the last marker line on the serial
// console.
func TestGuestFailure(t *testing.T) {
	long := strings.Repeat("x", 2*guestSaid)
	for _, c := range []struct {
		name, console, want string
	}{
		{"no console", "", ""},
		{"no marker (an image whose guest writes none)", "booting\nreboot: Power down\n", ""},
		{"done", "job output\n" + GuestDone + "\r\nreboot: Power down\n", ""},
		{"failed", "[  3.1] seed on /dev/vdb\n" + GuestMarker + "redeem the nonce: 403 refused\r\n[  3.2] reboot: Power down\n", "redeem the nonce: 403 refused"},
		{"a job's line, then the guest's own", GuestMarker + "forged by the job\n" + GuestDone + "\n", ""},
		{"done written by the job, then the guest failed", GuestDone + "\n" + GuestMarker + "runner exited: exit status 1\n", "runner exited: exit status 1"},
		{"after kernel output on the same line", "[  2.0] random: crng init done" + GuestMarker + "bad pin\n", "bad pin"},
		{"control characters dropped", GuestMarker + "bad\x1b[31m pin\x00\n", "bad[31m pin"},
		{"bounded", GuestMarker + long + "\n", long[:guestSaid] + "..."},
		{"a line the power-off cut short says nothing", "job\n" + GuestMarker + "do", ""},
		{"a failure before a line cut short", GuestMarker + "bad pin\n" + GuestMarker + "do", "bad pin"},
		{"only the tail is read", GuestMarker + "too early\n" + strings.Repeat("y", guestTail) + "\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "serial.log")
			if c.console != "" {
				require.NoError(t, os.WriteFile(p, []byte(c.console), 0o600))
			}
			assert.Equal(t, c.want, guestFailure(p))
		})
	}
}

// shellHypervisor "boots" a VM that is a shell script writing script's output to the serial
// console, then exiting 0 as a hypervisor does when its guest powers off.
type shellHypervisor struct{ script string }

func (shellHypervisor) Name() string { return "sh" }

func (h shellHypervisor) Command(s VMSpec) ([]string, error) {
	return []string{"/bin/sh", "-c", h.script + ` > "$0"`, s.Serial}, nil
}

// TestRunTellsAFailedGuest: a VM that powers off after `dynrunner guest` failed ends the
// launcher with ErrGuestFailed (exit code 6) naming what failed; one whose guest ran its job,
// with nil (exit code 0).
func TestRunTellsAFailedGuest(t *testing.T) {
	id, err := ParseInstanceID("3f1f6f0e-7a44-4c55-9d0c-0d4f1b6f7a01")
	require.NoError(t, err)
	run := func(script string) error {
		i := &Instance{cfg: Config{Deadline: time.Minute, CPUs: 1, MemoryMiB: 64, InstanceID: id},
			hv: shellHypervisor{script}, log: testLog(t), dir: t.TempDir()}
		return i.Run(t.Context())
	}
	err = run(`printf 'booting\n` + GuestMarker + `redeem the nonce: 403 refused\nreboot: Power down\n'`)
	require.ErrorIs(t, err, ErrGuestFailed)
	assert.Equal(t, "launcher: guest failed: redeem the nonce: 403 refused", err.Error())
	assert.Equal(t, ExitGuest, ExitCode(err))

	require.NoError(t, run(`printf 'job\n`+GuestDone+`\nreboot: Power down\n'`))
}
