//go:build unix

package standin

import (
	"os/exec"
	"syscall"
)

// ownProcessGroup puts the step in a process group of its own and makes cancelling it kill the
// whole group, so that what the script started does not outlive the job.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
}
