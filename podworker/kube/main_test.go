package kube_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
	"github.com/dynrunner/dynrunner/podworker/kube"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

// The test binary doubles as the executor inside the test image (FROM scratch, the binary as
// ENTRYPOINT, run by the test kubelet): with fakeEnv set it plays the executor mode it names.
const fakeEnv = "DYNRUNNER_FAKE_EXECUTOR"

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
	case "brief":
		// Runs long enough for a watcher to see the Pod Running before it succeeds.
		time.Sleep(time.Second)
		return 0
	case "exit3":
		return podworkertest.NonZeroExitCode
	case "secrets":
		if err := checkSecret(0o600); err != nil {
			return fail("%v", err)
		}
		return 0
	case "write-files":
		if err := podworkertest.WriteJobFiles(); err != nil {
			return fail("%v", err)
		}
		return 0
	case "spiffe":
		want := kube.SpiffeEndpointSocket
		if got := os.Getenv("SPIFFE_ENDPOINT_SOCKET"); got != want {
			return fail("SPIFFE_ENDPOINT_SOCKET=%q, want %q", got, want)
		}
		if _, err := os.Stat(strings.TrimPrefix(want, "unix://")); err != nil {
			return fail("%v", err)
		}
		return 0
	case "unprivileged":
		if err := checkUnprivileged(); err != nil {
			return fail("%v", err)
		}
		return 0
	case "diagnose":
		fmt.Println("a job line")
		fmt.Fprintln(os.Stderr, "dynrunner executor: first error")
		fmt.Fprintln(os.Stderr, `{"level":"info","message":"a log line"}`)
		fmt.Fprintln(os.Stderr, "dynrunner executor: wait for the SVID: context deadline exceeded")
		fmt.Println("the job's last line")
		return 1
	}
	return fail("unknown mode")
}

// checkSecret checks the conformance suite's secret file, with mode perm, in the read-only
// secrets directory.
func checkSecret(perm os.FileMode) error {
	p := filepath.Join(os.Getenv("DYNRUNNER_SECRETS_DIR"), podworkertest.SecretName)
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.Mode() != perm {
		return fmt.Errorf("%s has mode %v, want %v", p, fi.Mode(), perm)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != podworkertest.SecretContent {
		return fmt.Errorf("read %s: %q, %w", p, b, err)
	}
	if err := os.WriteFile(p, []byte("x"), 0o600); err == nil {
		return errors.New("the secrets directory is writable")
	}
	return nil
}

// checkUnprivileged checks, from inside, what an unprivileged Pod asks for: the runner user, no
// capabilities, no-new-privileges, a read-only root, writable emptyDirs, the secret readable
// through fsGroup.
func checkUnprivileged() error {
	if os.Getuid() != 1000 || os.Getgid() != 1000 {
		return fmt.Errorf("runs as %d:%d, want 1000:1000", os.Getuid(), os.Getgid())
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"} {
		if !strings.Contains(string(status), want+"\n") {
			return fmt.Errorf("/proc/self/status lacks %q:\n%s", want, status)
		}
	}
	if err := os.WriteFile("/should-fail", nil, 0o644); !errors.Is(err, syscall.EROFS) {
		return fmt.Errorf("writing / = %w, want EROFS", err)
	}
	if err := podworkertest.WriteJobFiles(); err != nil {
		return err
	}
	return checkSecret(0o640)
}
