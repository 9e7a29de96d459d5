package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Environment variables of the environment host process.
const (
	envHostVar = "DYNRUNNER_BENCH_ENVHOST" // set: this process is an environment host
	envHostURL = "DYNRUNNER_BENCH_FACADE_URL"
	envHostTD  = "DYNRUNNER_BENCH_TRUST_DOMAIN"
	// envHostFinish set: environments run envFinish instead of envHold.
	envHostFinish = "DYNRUNNER_BENCH_ENV_FINISH"
)

// envHostMain runs in the child process. It reads one JSON envSpec per line from stdin and
// runs each as an envHold environment, answering "fetched <task>" or "error <task> <why>" on
// stdout; it ends every environment when stdin closes. With envHostFinish set it runs them
// as envFinish environments, answering "done <task>" when one ended.
func envHostMain() int {
	td, err := spiffeid.TrustDomainFromString(os.Getenv(envHostTD))
	if err != nil {
		fmt.Fprintln(os.Stderr, "envhost:", err)
		return 2
	}
	target := facadeTarget{URL: os.Getenv(envHostURL), TD: td}
	finish := os.Getenv(envHostFinish) != ""
	ctx, cancel := context.WithCancel(context.Background())
	var outMu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	reply := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 64<<10), 1<<20)
	for in.Scan() {
		var spec envSpec
		if err := json.Unmarshal(in.Bytes(), &spec); err != nil {
			fmt.Fprintln(os.Stderr, "envhost: bad spec:", err)
			continue
		}
		wg.Go(func() {
			var err error
			if finish {
				if err = runEnv(ctx, target, spec, envFinish, nil); err == nil {
					reply("done %d", spec.Task)
				}
			} else {
				err = runEnv(ctx, target, spec, envHold, func() { reply("fetched %d", spec.Task) })
			}
			if err != nil && ctx.Err() == nil {
				reply("error %d %s", spec.Task, strings.ReplaceAll(err.Error(), "\n", " "))
			}
		})
	}
	cancel()
	wg.Wait()
	return 0
}

// envHost is the parent's side of an environment host process.
type envHost struct {
	cmd    *exec.Cmd
	queue  chan envSpec
	stop   sync.Once
	done   chan struct{}
	fetch  atomic.Int64
	fails  atomic.Int64
	mu     sync.Mutex
	first  string
	closed bool
}

// startEnvHost starts this test binary as an environment host for target, whose environments
// hold; notify is called after every answer from it.
func startEnvHost(b *testing.B, target facadeTarget, notify func()) *envHost {
	return startEnvHostWith(b, target, notify, nil)
}

// startEnvHostWith starts an environment host; with done set its environments finish their
// job, and done is called with each that did.
func startEnvHostWith(b *testing.B, target facadeTarget, notify func(), done func(assignment.TaskID)) *envHost {
	b.Helper()
	exe, err := os.Executable()
	require.NoError(b, err)
	logf, err := os.Create(filepath.Join(b.TempDir(), "envhost.log"))
	require.NoError(b, err)
	b.Cleanup(func() { _ = logf.Close() })
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), envHostVar+"=1", envHostURL+"="+target.URL, envHostTD+"="+target.TD.Name())
	if done != nil {
		cmd.Env = append(cmd.Env, envHostFinish+"=1")
	}
	cmd.Stderr = logf
	in, err := cmd.StdinPipe()
	require.NoError(b, err)
	out, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	h := &envHost{cmd: cmd, queue: make(chan envSpec, 1<<15), done: make(chan struct{})}
	go func() {
		// The writer: one spec per line, until close closes the queue; then stdin.
		enc := json.NewEncoder(in)
		for spec := range h.queue {
			_ = enc.Encode(spec)
		}
		_ = in.Close()
	}()
	go func() {
		defer close(h.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			kind, rest, _ := strings.Cut(sc.Text(), " ")
			switch kind {
			case "fetched":
				h.fetch.Add(1)
			case "done":
				if task, err := assignment.ParseTaskID(rest); err == nil && done != nil {
					done(task)
				}
			case "error":
				h.fails.Add(1)
				h.mu.Lock()
				if h.first == "" {
					h.first = rest
				}
				h.mu.Unlock()
			}
			notify()
		}
		_ = cmd.Wait()
	}()
	b.Cleanup(h.close)
	return h
}

// send queues spec for the host without blocking (the queue holds more than any benchmark
// starts); the environment then holds until the benchmark ends.
func (h *envHost) send(spec envSpec) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed {
		h.queue <- spec
	}
}

func (h *envHost) pid() string { return strconv.Itoa(h.cmd.Process.Pid) }

func (h *envHost) failure() (int64, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fails.Load(), h.first
}

// close ends the host's environments (by closing its stdin) and waits for it. It is idempotent.
func (h *envHost) close() {
	h.stop.Do(func() {
		h.mu.Lock()
		h.closed = true
		close(h.queue)
		h.mu.Unlock()
		<-h.done
	})
}
