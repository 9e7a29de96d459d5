//go:build !linux

package local

import (
	"errors"
	"syscall"
)

const procSupported = false

type procStat struct {
	State byte
	Pgrp  int
	Start uint64
}

func (s procStat) Exited() bool { return true }

type procInfo struct {
	PID int
	procStat
	marked bool
}

var errNoProc = errors.New("/proc is not available")

func readStat(int) (procStat, error)               { return procStat{}, errNoProc }
func scanProcs(string, int) ([]procInfo, error)    { return nil, errNoProc }
func scanUIDs() (map[uint32]bool, error)           { return nil, errNoProc }
func signalGroup(int, syscall.Signal) error        { return errNoProc }
func signalProc(int, uint64, syscall.Signal) error { return errNoProc }
