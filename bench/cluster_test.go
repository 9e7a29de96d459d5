package bench

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/testbed/fleetbed"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// clusterTasks is how many assignments each iteration of BenchmarkLifecyclesCluster drives
// to the end, whatever the number of replicas.
const clusterTasks = 1000

// planeHostImage is the image of the plane hosts: this test binary, static, FROM scratch.
const planeHostImage = "dynrunner-bench/planehost:test"

// profileDirVar names a directory: when set, BenchmarkLifecyclesCluster writes a CPU profile
// of its first replica there, controllers=N.pprof, from ready to stop.
const profileDirVar = "BENCH_CLUSTER_PROFILES"

// BenchmarkLifecyclesCluster is BenchmarkLifecycles against the fleetbed's 3-node JetStream
// cluster (every stream and bucket R3), with 1 and with 3 controller replicas, each in a
// container of its own on the bed's network: this test binary, built static, run as a plane
// host (scheduler, facade and pod worker on a no-op backend whose environments register over
// mTLS with that replica's facade). All replicas fetch from one fake forge, which this process
// serves as Gitea's RunnerService over HTTP on the network's gateway, and it checks that every
// task reached the forge's success exactly once.
//
// Metrics: lifecycles/s; cpu-ms/lifecycle, the replicas' containers' CPU (cgroup) per
// lifecycle, environments' client side included as in BenchmarkLifecycles; nats-cpu-ms/
// lifecycle, the three NATS containers'; total-cpu-ms/lifecycle, both plus this process
// (forge and the counting view); restarts/lifecycle, `started` transitions beyond one per task.
func BenchmarkLifecyclesCluster(b *testing.B) {
	if testing.Short() {
		b.Skip("benchmark with Docker containers; run without -short")
	}
	if err := fleetbed.NeedDocker(context.Background()); err != nil {
		if os.Getenv("CI") == "" {
			b.Skipf("%v (outside CI this benchmark skips; in CI it fails)", err)
		}
		b.Fatal(err)
	}
	c := newClusterBench(b)
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("controllers=%d", n), func(b *testing.B) { c.run(b, n) })
	}
}

// clusterBench is what the sub-benchmarks share: the bed, the image, the forge and a view
// that counts transitions. Task ids keep counting up across sub-benchmarks, so one event log
// serves them all.
type clusterBench struct {
	bed     *fleetbed.Bed
	image   string
	forge   *countingForge
	url     string // the forge as the containers reach it
	secrets string
	seq     int // containers started, for unique names

	mu      sync.Mutex
	seen    map[assignment.Transition]int
	changed chan struct{}
}

func newClusterBench(b *testing.B) *clusterBench {
	b.Helper()
	ctx := b.Context()
	began := time.Now()
	bin, err := staticTestBinary(b)
	require.NoError(b, err)
	image, err := fleetbed.ImportImage(ctx, bin, planeHostImage)
	require.NoError(b, err)
	bed, err := fleetbed.Start(ctx, fleetbed.Options{Dir: b.TempDir(), NATSOnly: true, Output: benchWriter{b}})
	require.NoError(b, err)
	b.Cleanup(func() { _ = bed.Close() })
	c := &clusterBench{bed: bed, image: image, forge: &countingForge{fakeForge: newFakeForge(), succ: map[int64]int{}},
		seen: map[assignment.Transition]int{}, changed: make(chan struct{}, 1)}

	// The forge, on the gateway: every replica fetches from this one.
	ln, err := net.Listen("tcp", net.JoinHostPort(bed.Gateway.String(), "0"))
	require.NoError(b, err)
	c.url = "http://" + ln.Addr().String()
	mux := http.NewServeMux()
	path, h := runnerv1connect.NewRunnerServiceHandler(c.forge)
	mux.Handle("/api/actions"+path, http.StripPrefix("/api/actions", h))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })

	c.secrets = b.TempDir()
	for name, data := range map[string]string{"runner-uuid": "bench-runner", "runner-token": "bench-runner-token"} {
		require.NoError(b, secretfile.WriteNew(filepath.Join(c.secrets, name), []byte(data)))
	}
	_, err = workload.LoadOrCreateDevCA(filepath.Join(c.secrets, "ca"), clusterTD)
	require.NoError(b, err)

	// This process's view counts the transitions; opening the event log here first creates
	// the R3 streams and buckets before any replica races to.
	url, err := bed.NATSHostURL(ctx)
	require.NoError(b, err)
	user, pass := bed.NATSCredentials()
	conn, err := natsconn.Connect(natsconn.Config{URL: url, User: user, Password: pass, Name: "bench"})
	require.NoError(b, err)
	b.Cleanup(conn.Close)
	js, err := jetstream.New(conn.NC)
	require.NoError(b, err)
	elCfg := eventlog.DefaultConfig()
	elCfg.Key = clusterTaskKey
	elCfg.Replicas = 3
	var l *eventlog.Log
	for deadline := time.Now().Add(time.Minute); ; { // a cluster just started may not have a meta leader yet
		if l, err = eventlog.Open(ctx, js, elCfg); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("open the R3 event log: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	view := eventlog.NewView()
	view.OnChange(c.count)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Watch(wctx, view) }()
	b.Cleanup(func() { cancel(); <-done })
	select {
	case <-view.Ready():
	case <-time.After(time.Minute):
		b.Fatal("the benchmark's view not ready within 1m")
	}
	b.Logf("bed %s with an R3 event log ready after %s", bed.ID, time.Since(began).Round(100*time.Millisecond))
	return c
}

func (c *clusterBench) count(st assignment.State) {
	c.mu.Lock()
	c.seen[st.Transition]++
	c.mu.Unlock()
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

func (c *clusterBench) n(tr assignment.Transition) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[tr]
}

// run starts n replicas, drives clusterTasks lifecycles through them per iteration, stops them
// and reports.
func (c *clusterBench) run(b *testing.B, n int) {
	ctx := b.Context()
	profiles := os.Getenv(profileDirVar)
	reps := make([]*replica, n)
	for i := range reps {
		prof := ""
		if i == 0 && profiles != "" {
			prof = filepath.Join(profiles, fmt.Sprintf("controllers=%d.pprof", n))
		}
		reps[i] = c.startReplica(b, prof)
	}
	for _, r := range reps {
		r.waitReady(b, 3*time.Minute)
	}
	b.Logf("%d replica(s) ready; load average before: %s", n, loadAvg())

	cpuOf := func(cs []*fleetbed.Container) time.Duration {
		var sum time.Duration
		for _, ct := range cs {
			d, err := ct.CPUTime(ctx)
			require.NoError(b, err)
			sum += d
		}
		return sum
	}
	ctrs := make([]*fleetbed.Container, n)
	for i, r := range reps {
		ctrs[i] = r.ctr
	}
	baseCompleted, baseStarted, baseFailed := c.n(assignment.Completed), c.n(assignment.Started), c.n(assignment.Failed)
	c.forge.fakeForge.mu.Lock()
	firstTask := c.forge.limit + 1 // every task released before was fetched: its lifecycle completed
	c.forge.fakeForge.mu.Unlock()
	rep0, nats0, self0 := cpuOf(ctrs), cpuOf(c.bed.NATS), cpuTime()
	b.ResetTimer()
	began := time.Now()
	done := 0
	for range b.N {
		c.forge.release(clusterTasks)
		done += clusterTasks
		// A failed assignment never completes: stop at it, and say why below.
		c.waitFor(b, 10*time.Minute, func() bool {
			return c.n(assignment.Completed)-baseCompleted >= done || c.n(assignment.Failed) > baseFailed
		}, func() string {
			return fmt.Sprintf("completed %d of %d; transitions %v; forge successes %d; replica logs:\n%s",
				c.n(assignment.Completed)-baseCompleted, done, c.seenCopy(), c.forge.successes.Load(), tails(reps))
		})
	}
	elapsed := time.Since(began)
	b.StopTimer()
	repCPU, natsCPU, selfCPU := cpuOf(ctrs)-rep0, cpuOf(c.bed.NATS)-nats0, cpuTime()-self0
	b.Logf("load average after: %s", loadAvg())

	var procCPU time.Duration
	var retries int64
	for _, r := range reps {
		res := r.stop(b)
		procCPU += res.CPU
		retries += res.RegisterRetries
		require.Zero(b, res.Doubles, "replica %s: environments the pod worker watched twice", r.ctr.Name)
		require.Zero(b, res.Failed, "replica %s: environments failed; first: %s", r.ctr.Name, res.FirstErr)
	}
	require.Zero(b, c.n(assignment.Failed)-baseFailed, "assignments failed; replica logs:\n%s", tails(reps))
	require.NoError(b, c.forge.exactlyOnce(firstTask, firstTask+int64(done)-1))
	restarts := c.n(assignment.Started) - baseStarted - done
	if retries > 0 {
		b.Logf("%d Register(s) refused as an invalid transition and sent again; replica logs:\n%s", retries, tails(reps))
	}
	b.Logf("%d lifecycles in %s on %d replica(s): replicas' CPU %s (their own rusage %s), NATS nodes' %s, this process's %s",
		done, elapsed.Round(time.Millisecond), n, repCPU.Round(time.Millisecond), procCPU.Round(time.Millisecond),
		natsCPU.Round(time.Millisecond), selfCPU.Round(time.Millisecond))
	f := float64(done)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / f }
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(f/elapsed.Seconds(), "lifecycles/s")
	b.ReportMetric(ms(repCPU), "cpu-ms/lifecycle")
	b.ReportMetric(ms(natsCPU), "nats-cpu-ms/lifecycle")
	b.ReportMetric(ms(repCPU+natsCPU+selfCPU), "total-cpu-ms/lifecycle")
	b.ReportMetric((repCPU+natsCPU+selfCPU).Seconds()/elapsed.Seconds(), "cpu-cores")
	b.ReportMetric(float64(restarts)/f, "restarts/lifecycle")
	b.ReportMetric(float64(retries), "register-retries")
	// Measured above; still a failure: the executor does not retry this refusal.
	assert.Zero(b, retries, "Registers refused as an invalid transition (a stale read of the assignment; see docs/benchmarks.md)")
}

func (c *clusterBench) seenCopy() map[assignment.Transition]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[assignment.Transition]int, len(c.seen))
	for k, v := range c.seen {
		out[k] = v
	}
	return out
}

// waitFor blocks until cond holds, polling on every counted transition and every second, or
// fails the benchmark after limit with what diag says.
func (c *clusterBench) waitFor(b *testing.B, limit time.Duration, cond func() bool, diag func() string) {
	b.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for !cond() {
		select {
		case <-c.changed:
		case <-tick.C:
		case <-deadline.C:
			b.Fatalf("not done within %s: %s", limit, diag())
		}
	}
}

// replica is one plane host's container, attached.
type replica struct {
	ctr     *fleetbed.Container
	cmd     *exec.Cmd
	logPath string
	ready   chan struct{}
	result  chan hostResult // the JSON line it prints when it stops
	exited  chan struct{}
}

func (c *clusterBench) startReplica(b *testing.B, profile string) *replica {
	b.Helper()
	c.seq++
	name := fmt.Sprintf("controller-%d", c.seq)
	user, pass := c.bed.NATSCredentials()
	cfg := hostConfig{Name: name, NATSURL: c.bed.NATSURL(), NATSUser: user, NATSPassword: pass, ForgeURL: c.url,
		SecretsDir: "/secrets", Concurrency: lifecycleConcurrency}
	flags := []string{"-v", c.secrets + ":/secrets:ro"}
	if profile != "" {
		require.NoError(b, os.MkdirAll(filepath.Dir(profile), 0o755))
		cfg.Profile = "/profile/" + filepath.Base(profile)
		flags = append(flags, "-v", filepath.Dir(profile)+":/profile")
	}
	js, err := json.Marshal(cfg)
	require.NoError(b, err)
	flags = append(flags, "-e", planeHostVar+"="+string(js))
	cmd, ctr := c.bed.Command(context.Background(), name, "controller", flags, c.image)
	r := &replica{ctr: ctr, cmd: cmd, logPath: filepath.Join(b.TempDir(), name+".log"),
		ready: make(chan struct{}), result: make(chan hostResult, 1), exited: make(chan struct{})}
	logf, err := os.Create(r.logPath)
	require.NoError(b, err)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	go func() {
		defer close(r.exited)
		defer logf.Close()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(r.ready)
				continue
			}
			var res hostResult
			if err := json.Unmarshal(sc.Bytes(), &res); err != nil {
				res.Err = fmt.Sprintf("unexpected output %q", sc.Text())
			}
			r.result <- res
			break
		}
		_, _ = bufio.NewReader(out).Discard(1 << 20) // let the CLI finish writing
		_ = cmd.Wait()
	}()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = r.ctr.Remove(ctx)
		select {
		case <-r.exited:
		case <-ctx.Done():
		}
	})
	return r
}

func (r *replica) waitReady(b *testing.B, limit time.Duration) {
	b.Helper()
	select {
	case <-r.ready:
	case <-r.exited:
		b.Fatalf("replica %s exited before ready: %s", r.ctr.Name, r.tail())
	case <-time.After(limit):
		b.Fatalf("replica %s not ready within %s: %s", r.ctr.Name, limit, r.tail())
	}
}

// stop sends SIGTERM and returns what the replica reported.
func (r *replica) stop(b *testing.B) hostResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(b, r.ctr.Stop(ctx, 30*time.Second), "stop %s", r.ctr.Name)
	select {
	case <-r.exited: // the result, if any, was sent before
	case <-ctx.Done():
		b.Fatalf("replica %s: not exited within a minute of SIGTERM: %s", r.ctr.Name, r.tail())
	}
	select {
	case res := <-r.result:
		require.Empty(b, res.Err, "replica %s; log: %s", r.ctr.Name, r.tail())
		return res
	default:
		b.Fatalf("replica %s exited without a result: %s", r.ctr.Name, r.tail())
	}
	return hostResult{}
}

func (r *replica) tail() string {
	data, err := os.ReadFile(r.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

func tails(reps []*replica) string {
	var sb strings.Builder
	for _, r := range reps {
		fmt.Fprintf(&sb, "--- %s\n%s\n", r.ctr.Name, r.tail())
	}
	return sb.String()
}

// staticTestBinary returns this test binary if it is static (no ELF interpreter: built with
// CGO_ENABLED=0), and otherwise builds the bench package's test binary static, so it can run
// in an image FROM scratch.
func staticTestBinary(b *testing.B) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	if f, err := elf.Open(exe); err == nil {
		static := true
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				static = false
			}
		}
		_ = f.Close()
		if static {
			return exe, nil
		}
	}
	bin := filepath.Join(b.TempDir(), "bench.test")
	build := exec.Command("go", "test", "-c", "-o", bin, "github.com/dynrunner/dynrunner/bench")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the static test binary: %w\n%s", err, out)
	}
	return bin, nil
}

// countingForge is the fake forge served over HTTP as Gitea's RunnerService, counting the
// successes of every task.
type countingForge struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	*fakeForge

	mu   sync.Mutex
	succ map[int64]int
}

func (f *countingForge) Declare(context.Context, *connect.Request[runnerv1.DeclareRequest]) (*connect.Response[runnerv1.DeclareResponse], error) {
	return connect.NewResponse(&runnerv1.DeclareResponse{}), nil
}

func (f *countingForge) FetchTask(ctx context.Context, req *connect.Request[runnerv1.FetchTaskRequest]) (*connect.Response[runnerv1.FetchTaskResponse], error) {
	resp, err := f.fakeForge.FetchTask(ctx, req.Msg.GetTasksVersion())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (f *countingForge) UpdateTask(ctx context.Context, req *connect.Request[runnerv1.UpdateTaskRequest]) (*connect.Response[runnerv1.UpdateTaskResponse], error) {
	if req.Msg.GetState().GetResult() == runnerv1.Result_RESULT_SUCCESS {
		f.mu.Lock()
		f.succ[req.Msg.GetState().GetId()]++
		f.mu.Unlock()
	}
	resp, err := f.fakeForge.UpdateTask(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

func (f *countingForge) UpdateLog(ctx context.Context, req *connect.Request[runnerv1.UpdateLogRequest]) (*connect.Response[runnerv1.UpdateLogResponse], error) {
	resp, err := f.fakeForge.UpdateLog(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(resp), nil
}

// exactlyOnce checks that tasks first to last each reached success exactly once.
func (f *countingForge) exactlyOnce(first, last int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var missing, doubled []int64
	for id := first; id <= last; id++ {
		switch n := f.succ[id]; {
		case n == 0:
			missing = append(missing, id)
		case n > 1:
			doubled = append(doubled, id)
		}
	}
	if len(missing) > 0 || len(doubled) > 0 {
		return fmt.Errorf("forge: %d task(s) never succeeded (first %v), %d succeeded more than once (first %v)",
			len(missing), missing[:min(5, len(missing))], len(doubled), doubled[:min(5, len(doubled))])
	}
	return nil
}

// benchWriter sends the bed's progress lines to the benchmark's log.
type benchWriter struct{ b *testing.B }

func (w benchWriter) Write(p []byte) (int, error) {
	w.b.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
