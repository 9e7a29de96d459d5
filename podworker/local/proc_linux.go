//go:build linux

package local

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"syscall"
)

const procSupported = true

// procStat is what the backend needs from /proc/<pid>/stat.
type procStat struct {
	state byte
	pgrp  int
	start uint64 // field 22, starttime, clock ticks since boot
}

// exited reports a zombie or dead process: it holds a pid but runs nothing.
func (s procStat) exited() bool { return s.state == 'Z' || s.state == 'X' || s.state == 'x' }

var errBadStat = errors.New("malformed /proc stat")

// parseStat parses the content of /proc/<pid>/stat. The command name (field 2) is in parentheses
// and may itself contain spaces and parentheses, so the fields are counted from the last ')'.
func parseStat(b []byte) (procStat, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errBadStat
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state), f[2] field 5 (pgrp), f[19] field 22 (starttime).
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, errBadStat
	}
	pgrp, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return procStat{}, errBadStat
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return procStat{}, errBadStat
	}
	return procStat{state: f[0][0], pgrp: pgrp, start: start}, nil
}

// readStat reads /proc/<pid>/stat. A process that does not exist gives an error wrapping
// fs.ErrNotExist.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	st, err := parseStat(b)
	if err != nil {
		return procStat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// procInfo is one process found by scanProcs.
type procInfo struct {
	pid int
	procStat
	// marked says the process's initial environment holds the scan's marker entry.
	marked bool
}

// scanProcs lists the processes that run (zombies left out), except this one. When marker is
// not empty it also reads each one's initial environment and sets marked when it has an entry
// equal to marker; when uid is not noUID it also marks each process whose real, effective,
// saved or file-system uid is uid. Processes it may not read are reported unmarked.
func scanProcs(marker string, uid int) ([]procInfo, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var out []procInfo
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || pid == self {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.exited() {
			continue // gone meanwhile, or a zombie
		}
		p := procInfo{pid: pid, procStat: st}
		if marker != "" {
			p.marked = environHas(pid, marker)
		}
		if !p.marked && uid != noUID {
			ids, err := procUIDs(pid)
			p.marked = err == nil && slices.Contains(ids[:], uint32(uid))
		}
		out = append(out, p)
	}
	return out, nil
}

// procUIDs reads the real, effective, saved and file-system uid of pid from
// /proc/<pid>/status.
func procUIDs(pid int) ([4]uint32, error) {
	var ids [4]uint32
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return ids, err
	}
	for line := range bytes.SplitSeq(b, []byte{'\n'}) {
		rest, ok := bytes.CutPrefix(line, []byte("Uid:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 4 {
			break
		}
		for i := range f {
			n, err := strconv.ParseUint(string(f[i]), 10, 32)
			if err != nil {
				return ids, fmt.Errorf("pid %d: %w", pid, errBadStat)
			}
			ids[i] = uint32(n)
		}
		return ids, nil
	}
	return ids, fmt.Errorf("pid %d: no uids in status: %w", pid, errBadStat)
}

// scanUIDs returns every uid a running process has as its real, effective, saved or
// file-system uid. Processes that end meanwhile are left out.
func scanUIDs() (map[uint32]bool, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]bool)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		if st, err := readStat(pid); err != nil || st.exited() {
			continue
		}
		ids, err := procUIDs(pid)
		if err != nil {
			continue
		}
		for _, u := range ids {
			out[u] = true
		}
	}
	return out, nil
}

// environHas reports whether /proc/<pid>/environ has the entry kv.
func environHas(pid int, kv string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	for entry := range bytes.SplitSeq(b, []byte{0}) {
		if string(entry) == kv {
			return true
		}
	}
	return false
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
	if err != nil || st.start != start {
		return nil
	}
	err = p.Signal(sig)
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}
