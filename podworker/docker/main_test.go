package docker_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

// The test binary doubles as the executor inside the test image (FROM scratch, the binary as
// ENTRYPOINT): with fakeEnv set it plays the executor mode it names.
const fakeEnv = "DYNRUNNER_FAKE_EXECUTOR"

// userEnv tells the hardened mode which uid:gid it must run as.
const userEnv = "DYNRUNNER_TEST_USER"

// Limits the hardening test configures and checks from inside.
const (
	hardenedMemory = 256 << 20
	hardenedPids   = 128
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeEnv); mode != "" {
		os.Exit(fakeExecutor(mode))
	}
	code := m.Run()
	kubetest.RemoveTestBinaryImage()
	os.Exit(code)
}

// fakeExecutor plays the executor; its exit code is the process's. Failures are reported the
// way the real executor reports them, so Diagnose finds them.
func fakeExecutor(mode string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "dynrunner executor: fake %s: %s\n", mode, fmt.Sprintf(format, args...))
		return 10
	}
	switch mode {
	case "forever":
		for {
			time.Sleep(time.Hour)
		}
	case "exit0":
		return 0
	case "exit3":
		return podworkertest.NonZeroExitCode
	case "secrets":
		p := filepath.Join(os.Getenv("DYNRUNNER_SECRETS_DIR"), podworkertest.SecretName)
		fi, err := os.Stat(p)
		if err != nil {
			return fail("%v", err)
		}
		if fi.Mode() != 0o600 {
			return fail("%s has mode %v", p, fi.Mode())
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != podworkertest.SecretContent {
			return fail("read %s: %q, %v", p, b, err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o600); err == nil {
			return fail("the secrets directory is writable")
		}
		return 0
	case "write-files":
		if err := podworkertest.WriteJobFiles(); err != nil {
			return fail("%v", err)
		}
		return 0
	case "hardened":
		if err := checkHardened(); err != nil {
			return fail("%v", err)
		}
		return 0
	case "dial":
		if err := checkDials(); err != nil {
			return fail("%v", err)
		}
		return 0
	case "listen":
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(listenPort))
		if err != nil {
			return fail("%v", err)
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				return fail("%v", err)
			}
			_, _ = c.Write([]byte("hello\n"))
			c.Close()
		}
	case "diagnose":
		fmt.Println("dynrunner executor: a job line on stdout, never a diagnosis")
		fmt.Fprintln(os.Stderr, "dynrunner executor: first error")
		fmt.Fprintln(os.Stderr, `{"level":"info","message":"a log line"}`)
		fmt.Fprintln(os.Stderr, "dynrunner executor: wait for the SVID: context deadline exceeded")
		fmt.Println("dynrunner executor: the job's last line")
		return 1
	}
	return fail("unknown mode")
}

// checkHardened checks, from inside, what the hardening test configures: no capabilities,
// no-new-privileges, a read-only root, a non-root user, writable tmpfs, and the limits.
func checkHardened() error {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"} {
		if !strings.Contains(string(status), want+"\n") {
			return fmt.Errorf("/proc/self/status lacks %q:\n%s", want, status)
		}
	}
	if err := os.WriteFile("/should-fail", nil, 0o644); !errors.Is(err, syscall.EROFS) {
		return fmt.Errorf("writing / = %w, want EROFS", err)
	}
	if user := fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid()); user != os.Getenv(userEnv) || strings.HasPrefix(user, "0:") {
		return fmt.Errorf("runs as %s, want %s (not root)", user, os.Getenv(userEnv))
	}
	for _, d := range []string{os.Getenv("DYNRUNNER_WORK_DIR"), os.Getenv("HOME"), os.Getenv("TMPDIR")} {
		if err := os.WriteFile(filepath.Join(d, "probe"), nil, 0o755); err != nil {
			return err
		}
	}
	mem, err := readLimit("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
	if err != nil || mem != strconv.Itoa(hardenedMemory) {
		return fmt.Errorf("memory limit %q, %w; want %d", mem, err, hardenedMemory)
	}
	pids, err := readLimit("/sys/fs/cgroup/pids.max", "/sys/fs/cgroup/pids/pids.max")
	if err != nil || pids != strconv.Itoa(hardenedPids) {
		return fmt.Errorf("pids limit %q, %w; want %d", pids, err, hardenedPids)
	}
	return nil
}

// Variables of the "dial" mode: comma-separated host:port lists the container must reach, and
// must not.
const (
	dialReachEnv  = "DYNRUNNER_TEST_REACH"
	dialRefuseEnv = "DYNRUNNER_TEST_REFUSE"
)

// listenPort is where the "listen" mode answers.
const listenPort = 9000

// checkDials connects to every address of dialReachEnv, and fails to connect to every address
// of dialRefuseEnv, each within a few seconds.
func checkDials() error {
	var errs []error
	for _, a := range strings.Split(os.Getenv(dialReachEnv), ",") {
		if a == "" {
			continue
		}
		c, err := net.DialTimeout("tcp", a, 5*time.Second)
		if err != nil {
			errs = append(errs, fmt.Errorf("want to reach %s: %w", a, err))
			continue
		}
		c.Close()
	}
	for _, a := range strings.Split(os.Getenv(dialRefuseEnv), ",") {
		if a == "" {
			continue
		}
		if c, err := net.DialTimeout("tcp", a, 3*time.Second); err == nil {
			c.Close()
			errs = append(errs, fmt.Errorf("reached %s, want it refused", a))
		}
	}
	return errors.Join(errs...)
}

// readLimit reads the first of the cgroup v2 or v1 files that exists.
func readLimit(paths ...string) (string, error) {
	var errs []error
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil {
			return strings.TrimSpace(string(b)), nil
		}
		errs = append(errs, err)
	}
	return "", errors.Join(errs...)
}
