package local_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/local"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

// The test binary doubles as the executor (the real `dynrunner executor` is another package's)
// and as a controller process the tests kill.
const (
	// fakeEnv selects a fake executor mode; see fakeExecutor.
	fakeEnv = "DYNRUNNER_FAKE_EXECUTOR"
	// controllerEnv makes the binary a controller that starts one environment under the root
	// directory it names, prints the handle as JSON and waits to be killed.
	controllerEnv = "DYNRUNNER_LOCAL_TEST_CONTROLLER"
	// childPIDFile is where the stray and escape modes record their child, in the work dir.
	childPIDFile = "child.pid"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeEnv); mode != "" {
		os.Exit(fakeExecutor(mode))
	}
	if root := os.Getenv(controllerEnv); root != "" {
		os.Exit(controller(root))
	}
	os.Exit(m.Run())
}

// fakeExecutor plays the executor; its exit code is the process's.
func fakeExecutor(mode string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "fake executor %s: %s\n", mode, fmt.Sprintf(format, args...))
		return 10
	}
	switch mode {
	case "forever":
		sleepForever()
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		sleepForever()
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
		return 0
	case "write-files":
		if err := podworkertest.WriteJobFiles(); err != nil {
			return fail("%v", err)
		}
		return 0
	case "check-env":
		if err := checkEnv(); err != nil {
			return fail("%v", err)
		}
		return 0
	case "attack":
		if err := attack(); err != nil {
			return fail("%v", err)
		}
		return 0
	case "escape-clean":
		// A child in a session of its own with none of the environment's variables: only
		// its uid says whose it is. (os.Args[0] is the original test binary, which the
		// environment's user may not reach.)
		exe, err := os.Executable()
		if err != nil {
			return fail("%v", err)
		}
		cmd := exec.Command(exe)
		cmd.Env = []string{fakeEnv + "=forever"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			return fail("%v", err)
		}
		if err := writeAtomic(filepath.Join(os.Getenv("DYNRUNNER_WORK_DIR"), childPIDFile),
			[]byte(strconv.Itoa(cmd.Process.Pid))); err != nil {
			return fail("%v", err)
		}
		sleepForever()
	case "stray", "escape":
		// stray: a child in the executor's process group that ignores SIGTERM, then exit.
		// escape: a child in a session of its own, then run on.
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), fakeEnv+"=ignore-term")
		if mode == "escape" {
			cmd.Env = append(os.Environ(), fakeEnv+"=forever")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		}
		if err := cmd.Start(); err != nil {
			return fail("%v", err)
		}
		if err := writeAtomic(filepath.Join(os.Getenv("DYNRUNNER_WORK_DIR"), childPIDFile),
			[]byte(strconv.Itoa(cmd.Process.Pid))); err != nil {
			return fail("%v", err)
		}
		if mode == "escape" {
			sleepForever()
		}
		return 0
	}
	return fail("unknown mode")
}

func sleepForever() {
	for {
		time.Sleep(time.Hour)
	}
}

func writeAtomic(p string, b []byte) error {
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// checkEnv checks the environment the backend gives the executor (see TestStartEnvironment).
func checkEnv() error {
	env := os.Getenv("DYNRUNNER_ENV_DIR")
	want := map[string]string{
		"DYNRUNNER_SECRETS_DIR": filepath.Join(env, "secrets"),
		"DYNRUNNER_WORK_DIR":    filepath.Join(env, "work"),
		"HOME":                  filepath.Join(env, "home"),
		"TMPDIR":                filepath.Join(env, "tmp"),
		"FROM_BASE":             "base",
		"FROM_SPEC":             "spec",
		"OVERRIDDEN":            "by-spec",
	}
	for k, v := range want {
		if got := os.Getenv(k); got != v {
			return fmt.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	for _, k := range []string{"HOME", "TMPDIR", "DYNRUNNER_SECRETS_DIR", "DYNRUNNER_WORK_DIR"} {
		if fi, err := os.Stat(os.Getenv(k)); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			return fmt.Errorf("%s: %v, %w", k, fi, err)
		}
	}
	if v, ok := os.LookupEnv("DYNRUNNER_TEST_NOT_INHERITED"); ok {
		return fmt.Errorf("inherited DYNRUNNER_TEST_NOT_INHERITED=%q from the controller", v)
	}
	if wd, err := os.Getwd(); err != nil || wd != want["DYNRUNNER_WORK_DIR"] {
		return fmt.Errorf("working directory %q, %w", wd, err)
	}
	if pgid, _ := syscall.Getpgid(0); pgid != os.Getpid() {
		return fmt.Errorf("pgid %d, pid %d: not a process group leader", pgid, os.Getpid())
	}
	if sid, _, _ := syscall.RawSyscall(syscall.SYS_GETSID, 0, 0, 0); int(sid) != os.Getpid() {
		return fmt.Errorf("sid %d, pid %d: not a session leader", sid, os.Getpid())
	}
	if fi, err := os.Stdin.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return fmt.Errorf("stdin is not /dev/null: %v, %w", fi, err)
	}
	return nil
}

// controller starts one environment that runs forever, prints its handle and waits.
func controller(root string) int {
	b, err := local.New(local.Config{Root: root, Command: []string{os.Args[0]}, BaseEnv: baseEnv()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	h, err := b.Start(context.Background(), podworker.Spec{
		Task: 77, Epoch: 5, Env: map[string]string{fakeEnv: "forever"},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var buf bytes.Buffer
	_ = json.NewEncoder(&buf).Encode(h)
	_, _ = os.Stdout.Write(buf.Bytes())
	sleepForever()
	return 0
}

// baseEnv is the executor's base environment. A race-enabled binary otherwise sleeps a second
// before it exits with 0.
func baseEnv() []string {
	return []string{"PATH=" + os.Getenv("PATH"), "GORACE=atexit_sleep_ms=0"}
}

// modes maps the conformance behaviors to fake executor modes.
var modes = map[podworkertest.Behavior]string{
	podworkertest.RunForever:        "forever",
	podworkertest.ExitZero:          "exit0",
	podworkertest.ExitNonZero:       "exit3",
	podworkertest.CheckSecrets:      "secrets",
	podworkertest.WriteFilesAndExit: "write-files",
}

func fakeSpec(task assignment.TaskID, epoch assignment.Epoch, mode string) podworker.Spec {
	return podworker.Spec{Task: task, Epoch: epoch, Env: map[string]string{fakeEnv: mode}}
}
