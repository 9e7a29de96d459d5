package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// Environment of the restarted controller's process (restartMain).
const (
	restartVar      = "DYNRUNNER_BENCH_RESTART" // set: this process is the restarted controller; the NATS URL
	restartPassword = "bench-restart"
)

// restartKey authenticates the records of BenchmarkRestartWithHistory.
var restartKey = []byte("0123456789abcdef0123456789abcdef")

// restartLive is how many live assignments BenchmarkRestartWithHistory keeps beside the
// history.
const restartLive = 100

// restartResult is what the restarted controller reports on stdout.
type restartResult struct {
	Live, Len int
	RSS, HWM  uint64
	HeapInuse uint64
	Err       string
}

// BenchmarkRestartWithHistory measures a controller's restart over a history of ended
// assignments: 0, 10k, 100k and 1M of them, each a claimed and a completed record written by
// eventlog.GenerateEnded straight into the stream, beside 100 live assignments. The controller
// is a child process (this test binary again) that connects to the parent's NATS server, opens
// the event log and feeds a view until it is ready; so the server and the generator stay out
// of its memory. The child starts twice: first over the generated history (the index of live
// assignments has no tail: it reads the whole stream once, as the first start after an
// upgrade does), then again, the restart measured.
//
// Metrics: ready-s, from starting the process to its view being ready; rss-MiB, its resident
// memory then, after a garbage collection; rss-peak-MiB, its high-water mark; first-start-s,
// the first start's ready-s, and first-start-rss-peak-MiB its high-water mark. The
// measurement is made once, whatever b.N.
func BenchmarkRestartWithHistory(b *testing.B) {
	for _, n := range []int{0, 10_000, 100_000, 1_000_000} {
		b.Run(historyName(n), func(b *testing.B) { restartWithHistory(b, n) })
	}
}

func historyName(n int) string {
	switch {
	case n >= 1_000_000:
		return strconv.Itoa(n/1_000_000) + "M"
	case n >= 1000:
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func restartWithHistory(b *testing.B, n int) {
	port := freePorts(b, 1)[0]
	c, err := natsconn.Connect(natsconn.Config{StoreDir: b.TempDir(), Listen: fmt.Sprintf("127.0.0.1:%d", port),
		User: "bench", Password: restartPassword, Name: "bench"})
	require.NoError(b, err)
	b.Cleanup(c.Close)
	js, err := jetstreamOf(c)
	require.NoError(b, err)
	cfg := eventlog.DefaultConfig()
	cfg.Key = restartKey
	ctx := b.Context()
	l, err := eventlog.Open(ctx, js, cfg)
	require.NoError(b, err)
	began := time.Now()
	require.NoError(b, l.GenerateEnded(ctx, 1_000_000, n, time.Now().Add(-time.Hour)))
	generated := time.Since(began)
	for task := assignment.TaskID(1); task <= restartLive; task++ {
		_, err := l.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: task, Actor: "bench", At: time.Now(),
			Backend: assignment.BackendPod, TaskDigest: "d", Lease: time.Hour, Pickup: 30 * time.Minute}, nil)
		require.NoError(b, err)
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	first, firstReady := runRestart(b, url)
	r, ready := runRestart(b, url)
	b.StopTimer()
	for _, res := range []restartResult{first, r} {
		require.Equal(b, restartLive, res.Live, "live assignments in the restarted view")
	}
	require.Equal(b, restartLive, r.Len, "assignments in the restarted view, want only the live ones")
	b.Logf("%d ended assignments generated in %s; load average %s; first start %s (view %d), restart %s (view %d)",
		n, generated.Round(time.Millisecond), loadAvg(), firstReady.Round(time.Millisecond), first.Len, ready.Round(time.Millisecond), r.Len)
	const mib = 1 << 20
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ready.Seconds(), "ready-s")
	b.ReportMetric(float64(r.RSS)/mib, "rss-MiB")
	b.ReportMetric(float64(r.HWM)/mib, "rss-peak-MiB")
	b.ReportMetric(float64(r.HeapInuse)/mib, "heap-inuse-MiB")
	b.ReportMetric(firstReady.Seconds(), "first-start-s")
	b.ReportMetric(float64(first.HWM)/mib, "first-start-rss-peak-MiB")
}

// runRestart starts the restarted controller against url and returns its report and how long
// it took from starting the process to its view being ready.
func runRestart(b *testing.B, url string) (restartResult, time.Duration) {
	b.Helper()
	exe, err := os.Executable()
	require.NoError(b, err)
	logf, err := os.Create(filepath.Join(b.TempDir(), "restart.log"))
	require.NoError(b, err)
	defer logf.Close()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), restartVar+"="+url)
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	require.NoError(b, err)
	start := time.Now()
	require.NoError(b, cmd.Start())
	defer func() { _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	var ready time.Duration
	var r restartResult
	for sc.Scan() {
		if sc.Text() == "ready" {
			ready = time.Since(start)
			continue
		}
		require.NoError(b, json.Unmarshal(sc.Bytes(), &r), "restarted controller: %q", sc.Text())
	}
	if r.Err != "" || ready == 0 {
		log, _ := os.ReadFile(logf.Name())
		b.Fatalf("restarted controller: %s (ready after %s); stderr: %s", r.Err, ready, log)
	}
	return r, ready
}

// restartMain runs in the child: open the event log on the parent's server, feed a view until
// it is ready, say "ready", then report the view and the process's memory as one JSON line.
func restartMain() int {
	enc := json.NewEncoder(os.Stdout)
	fail := func(err error) int { _ = enc.Encode(restartResult{Err: err.Error()}); return 1 }
	c, err := natsconn.Connect(natsconn.Config{URL: os.Getenv(restartVar), User: "bench", Password: restartPassword, Name: "restart"})
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	js, err := jetstreamOf(c)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg := eventlog.DefaultConfig()
	cfg.Key = restartKey
	l, err := eventlog.Open(ctx, js, cfg)
	if err != nil {
		return fail(err)
	}
	v := eventlog.NewView()
	errc := make(chan error, 1)
	go func() { errc <- l.Watch(ctx, v) }()
	select {
	case <-v.Ready():
	case err := <-errc:
		return fail(fmt.Errorf("watch ended before the view was ready: %w", err))
	case <-time.After(10 * time.Minute):
		return fail(fmt.Errorf("the view was not ready within 10 minutes"))
	}
	fmt.Println("ready")
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err := rssBytes("self")
	if err != nil {
		return fail(err)
	}
	hwm, _ := statusKB("self", "VmHWM:")
	_ = enc.Encode(restartResult{Live: len(v.Live()), Len: v.Len(), RSS: rss, HWM: hwm, HeapInuse: ms.HeapInuse})
	cancel()
	if err := <-errc; err != nil {
		return fail(err)
	}
	return 0
}

func jetstreamOf(c *natsconn.Conn) (jetstream.JetStream, error) { return jetstream.New(c.NC) }
