package bench

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTime is the user and system CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadAvg is /proc/loadavg's first three fields: the machine's load, which tells a quiet run
// from one that shared the two cores with other work.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// rssBytes is VmRSS from /proc/<pid>/status ("self" for this process).
func rssBytes(pid string) (uint64, error) { return statusKB(pid, "VmRSS:") }

// statusKB is the field (a size in kB, such as "VmHWM:") of /proc/<pid>/status, in bytes.
func statusKB(pid, field string) (uint64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(b) {
		if rest, ok := bytes.CutPrefix(line, []byte(field)); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(string(rest)), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, os.ErrNotExist
}

// procCPU is the user and system CPU time process pid has used (/proc/<pid>/stat, in clock
// ticks: USER_HZ, 100 per second on Linux for amd64 and arm64).
func procCPU(pid string) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces: count after it.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, os.ErrInvalid
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, os.ErrInvalid
	}
	var ticks uint64
	for _, s := range f[11:13] { // utime and stime, fields 14 and 15
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}
