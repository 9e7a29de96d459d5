package kubetest

import (
	"os"
	"strconv"
	"strings"
)

// capNames are the Linux capabilities by number (capability.h).
var capNames = []string{
	"CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
	"SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
	"IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
	"SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
	"LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
	"WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
}

// engineCaps is how many of capNames every supported Docker engine knows: 20.10 refuses
// PERFMON, BPF and CHECKPOINT_RESTORE by name.
const engineCaps = 38

// privilegedCaps decides how the Kubelet runs privileged containers. When this process (on the
// Docker host, like the engine) holds every capability the kernel knows, it returns nil: a
// privileged container is privileged. Otherwise, on hosts that are themselves confined (a
// container, a sandbox without CAP_SYS_RESOURCE), runc cannot give a privileged container
// every capability and refuses to start it; it then returns the capabilities this process
// does hold (those the engine knows by name), and a privileged container runs unprivileged with those added, seccomp and
// AppArmor unconfined and /proc unmasked, but without the host's devices.
func privilegedCaps() []string {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	var bnd uint64
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapBnd:"); ok {
			if bnd, err = strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil {
				return nil
			}
		}
	}
	last := len(capNames) - 1
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n < len(capNames) {
			last = n
		}
	}
	var held []string
	all := true
	for i := 0; i <= last; i++ {
		switch {
		case bnd&(1<<i) == 0:
			all = false
		case i < engineCaps:
			held = append(held, capNames[i])
		}
	}
	if all {
		return nil
	}
	return held
}
