//go:build !linux

package devforge

import (
	"os/exec"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error { return cmd.Process.Signal(sig) }
