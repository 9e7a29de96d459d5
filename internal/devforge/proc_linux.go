package devforge

import (
	"os/exec"
	"syscall"
)

// sysProcAttr puts the child in its own process group (so stop reaches the git processes it
// spawns) and kills it if the test binary dies without calling Close.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	return syscall.Kill(-cmd.Process.Pid, sig)
}
