//go:build !linux

package testproc

import (
	"os"
	"syscall"
)

func sysProcAttr() *syscall.SysProcAttr { return nil }

// signalGroup signals p alone: only Linux starts it in a group of its own.
func signalGroup(p *os.Process, sig syscall.Signal) error { return p.Signal(sig) }
