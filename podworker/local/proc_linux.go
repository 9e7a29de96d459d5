//go:build linux

package local

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"

	"github.com/dynrunner/dynrunner/internal/procfs"
)

const procSupported = true

// procStat is what the backend needs from /proc/<pid>/stat.
type procStat = procfs.Stat

// readStat reads /proc/<pid>/stat. A process that does not exist gives an error wrapping
// fs.ErrNotExist.
func readStat(pid int) (procStat, error) { return procfs.ReadStat(pid) }

// procInfo is one process found by scanProcs.
type procInfo struct {
	procfs.Proc
	// marked says the process's initial environment holds the scan's marker entry.
	marked bool
}

// scanProcs lists the processes that run (zombies left out), except this one. When marker is
// not empty it also reads each one's initial environment and sets marked when it has an entry
// equal to marker; when uid is not noUID it also marks each process whose real, effective,
// saved or file-system uid is uid. Processes it may not read are reported unmarked.
func scanProcs(marker string, uid int) ([]procInfo, error) {
	procs, err := procfs.Running()
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var out []procInfo
	for _, proc := range procs {
		if proc.PID == self {
			continue
		}
		p := procInfo{Proc: proc}
		if marker != "" {
			env, err := procfs.Environ(p.PID)
			p.marked = err == nil && slices.Contains(env, marker)
		}
		if !p.marked && uid != noUID {
			ids, err := procfs.UIDs(p.PID)
			p.marked = err == nil && slices.Contains(ids[:], uint32(uid))
		}
		out = append(out, p)
	}
	return out, nil
}

// scanUIDs returns every uid a running process has as its real, effective, saved or
// file-system uid. Processes that end meanwhile are left out.
func scanUIDs() (map[uint32]bool, error) {
	procs, err := procfs.Running()
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]bool)
	for _, p := range procs {
		ids, err := procfs.UIDs(p.PID)
		if err != nil {
			continue
		}
		for _, u := range ids {
			out[u] = true
		}
	}
	return out, nil
}

// signalGroup sends sig to the process group pgid.
func signalGroup(pgid int, sig syscall.Signal) error {
	if pgid <= 1 || pgid == syscall.Getpgrp() {
		return fmt.Errorf("refusing to signal process group %d", pgid)
	}
	err := syscall.Kill(-pgid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// signalProc sends sig to pid if it is still the process that started at start. It signals
// through a pidfd opened before the start time is checked, so a reused pid is never hit.
func signalProc(pid int, start uint64, sig syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return nil
	}
	defer func() { _ = p.Release() }()
	st, err := readStat(pid)
	if err != nil || st.Start != start {
		return nil
	}
	err = p.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}
