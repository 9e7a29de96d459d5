//go:build linux

package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrBadStat is returned for a /proc stat or status file that does not parse.
var ErrBadStat = errors.New("malformed /proc stat")

// Stat is what is read from /proc/<pid>/stat.
type Stat struct {
	Comm  string // field 2, the command name (at most 15 bytes)
	State byte   // field 3
	Pgrp  int    // field 5, the process group
	Start uint64 // field 22, starttime, clock ticks since boot
}

// Exited reports a zombie or dead process: it holds a pid but runs nothing.
func (s Stat) Exited() bool { return s.State == 'Z' || s.State == 'X' || s.State == 'x' }

// ParseStat parses the content of /proc/<pid>/stat. The command name (field 2) is in
// parentheses and may itself contain spaces and parentheses, so the fields are counted from the
// last ')'. Anything else is ErrBadStat, with the zero Stat.
func ParseStat(b []byte) (Stat, error) {
	open, i := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || i < open {
		return Stat{}, ErrBadStat
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state), f[2] field 5 (pgrp), f[19] field 22 (starttime).
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, ErrBadStat
	}
	pgrp, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return Stat{}, ErrBadStat
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return Stat{}, ErrBadStat
	}
	return Stat{Comm: string(b[open+1 : i]), State: f[0][0], Pgrp: pgrp, Start: start}, nil
}

// ReadStat reads /proc/<pid>/stat. A process that does not exist gives an error wrapping
// fs.ErrNotExist.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile(path(pid, "stat"))
	if err != nil {
		return Stat{}, err
	}
	st, err := ParseStat(b)
	if err != nil {
		return Stat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// Proc is one process Running found.
type Proc struct {
	PID int
	Stat
}

// Running lists the processes that run, this one included: zombies and dead processes are
// left out, and so are those that end while it reads.
func Running() ([]Proc, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 {
			continue
		}
		st, err := ReadStat(pid)
		if err != nil || st.Exited() {
			continue // gone meanwhile, or a zombie
		}
		out = append(out, Proc{PID: pid, Stat: st})
	}
	return out, nil
}

// Cmdline returns the arguments of pid, from /proc/<pid>/cmdline.
func Cmdline(pid int) ([]string, error) { return nulList(pid, "cmdline") }

// Environ returns the initial environment of pid, from /proc/<pid>/environ, as key=value
// entries.
func Environ(pid int) ([]string, error) { return nulList(pid, "environ") }

// nulList reads the NUL-terminated strings of /proc/<pid>/<name>.
func nulList(pid int, name string) ([]string, error) {
	b, err := os.ReadFile(path(pid, name))
	if err != nil || len(b) == 0 {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), nil
}

func path(pid int, name string) string { return "/proc/" + strconv.Itoa(pid) + "/" + name }

// UIDs reads the real, effective, saved and file-system uid of pid from /proc/<pid>/status.
func UIDs(pid int) ([4]uint32, error) {
	var ids [4]uint32
	b, err := os.ReadFile(path(pid, "status"))
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
				return ids, fmt.Errorf("pid %d: %w", pid, ErrBadStat)
			}
			ids[i] = uint32(n)
		}
		return ids, nil
	}
	return ids, fmt.Errorf("pid %d: no uids in status: %w", pid, ErrBadStat)
}
