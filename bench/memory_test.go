package bench

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// inFlight is how many assignments BenchmarkMemory10k holds running at once; it is also the
// pod worker's POD_CONCURRENCY there.
const inFlight = 10_000

// BenchmarkMemory10k measures the controller's memory with 10,000 assignments in flight: each
// claimed, dispatched, started, registered over mTLS and fetched by its environment, which then
// holds its connection to the facade open as a running job does. The environments run in a
// child process (this test binary again) so only the control plane's memory is counted here.
//
//   - all: `COMPONENTS=all` in one process: JetStream (embedded), the view, the scheduler, the
//     facade with 10,000 live TLS connections, and the pod worker with 10,000 environments.
//   - split: the facade in a process of its own (a facade host, `COMPONENTS=facade`, against
//     the same embedded server over loopback); the measured process holds JetStream, the view,
//     the scheduler and the pod worker. The facade host's memory is reported beside it.
//
// The measurement is made once, whatever b.N.
func BenchmarkMemory10k(b *testing.B) {
	// split first: a process does not give back all it held, so whichever runs second starts
	// higher (its rss-delta-MiB holds); run one alone (-bench Memory10k/all) for its own figure.
	b.Run("split", func(b *testing.B) { memory10k(b, true) })
	b.Run("all", func(b *testing.B) { memory10k(b, false) })
}

func memory10k(b *testing.B, split bool) {
	// A long pickup and lease: nothing may expire while 10,000 environments come up.
	cfg := planeConfig{Concurrency: inFlight, Lease: 30 * time.Minute, Pickup: 20 * time.Minute, NoFacade: split}
	var p *plane
	var fh *facadeHost
	if split {
		p = newListeningPlane(b)
		fh = startFacadeHost(b, p, cfg.Lease, false)
	} else {
		p = newPlane(b)
	}
	host := startEnvHost(b, p.target, p.poke)
	backend := newRemoteBackend(host.send)
	p.start(cfg, backend)
	b.Logf("load average before: %s", loadAvg())

	before := memNow(b)
	var facadeBefore uint64
	if split {
		var err error
		facadeBefore, err = rssBytes(fh.pid())
		require.NoError(b, err)
	}
	began := time.Now()
	p.forge.release(inFlight)
	p.waitFor(5*time.Minute, func() bool {
		n, first := host.failure()
		require.Zero(b, n, "environments failed; first: %s", first)
		backend.checkDoubles(b)
		return host.fetch.Load() >= inFlight && p.n(assignment.Running) >= inFlight
	}, func() string {
		return fmt.Sprintf("%s; environments fetched %d", p, host.fetch.Load())
	})
	up := time.Since(began)
	// Let the reconciler and the worker's loops run over the full set before measuring.
	time.Sleep(3 * time.Second)
	after := memNow(b)
	writeHeapProfile(b)
	child, err := rssBytes(host.pid())
	require.NoError(b, err)
	b.StopTimer()
	b.Logf("load average after: %s; %d in flight after %s; controller %+v, before %+v", loadAvg(), inFlight, up.Round(time.Millisecond), after, before)

	const mib = 1 << 20
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(after.heapInuse)/mib, "heap-inuse-MiB")
	b.ReportMetric(float64(after.heapAlloc)/mib, "heap-alloc-MiB")
	b.ReportMetric(float64(after.heapInuse-before.heapInuse)/mib, "heap-delta-MiB")
	b.ReportMetric(float64(after.heapInuse-before.heapInuse)/inFlight/1024, "heap-KiB/assignment")
	b.ReportMetric(float64(after.stackInuse)/mib, "stack-inuse-MiB")
	b.ReportMetric(float64(after.rss)/mib, "rss-MiB")
	b.ReportMetric(float64(after.rss-before.rss)/mib, "rss-delta-MiB")
	b.ReportMetric(float64(after.goroutines-before.goroutines)/inFlight, "goroutines/assignment")
	b.ReportMetric(float64(child)/mib, "envhost-rss-MiB")
	b.ReportMetric(float64(inFlight)/up.Seconds(), "running/s")
	if split {
		facade, err := rssBytes(fh.pid())
		require.NoError(b, err)
		b.ReportMetric(float64(facade)/mib, "facade-rss-MiB")
		b.ReportMetric(float64(facade-facadeBefore)/inFlight/1024, "facade-rss-KiB/connection")
	}
}

// memSample is the process's memory at one point, after a full garbage collection.
type memSample struct {
	heapInuse, heapAlloc, stackInuse, rss uint64
	goroutines                            int
}

func memNow(b *testing.B) memSample {
	b.Helper()
	for range 4 {
		runtime.GC()
	}
	debug.FreeOSMemory() // return freed pages, so RSS reflects what is in use
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err := rssBytes("self")
	require.NoError(b, err)
	return memSample{heapInuse: ms.HeapInuse, heapAlloc: ms.HeapAlloc, stackInuse: ms.StackInuse, rss: rss, goroutines: runtime.NumGoroutine()}
}

// writeHeapProfile writes the live heap to $BENCH_HEAPPROFILE, if set: the in-use view that
// -memprofile cannot give, since it is written after the benchmark let everything go.
func writeHeapProfile(b *testing.B) {
	path := os.Getenv("BENCH_HEAPPROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	require.NoError(b, err)
	defer f.Close()
	require.NoError(b, pprof.Lookup("heap").WriteTo(f, 0))
}
