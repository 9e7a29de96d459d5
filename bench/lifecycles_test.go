package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// lifecycleTasks is how many assignments each iteration of BenchmarkLifecycles drives to the
// end; lifecycleConcurrency is the pod worker's POD_CONCURRENCY.
const (
	lifecycleTasks       = 2000
	lifecycleConcurrency = 64
)

// BenchmarkLifecycles measures how many assignments per second the control plane takes from
// the forge to `completed`: claim, dispatch, start (token and SVID issued), register over
// mTLS, fetch, one log report, final success, environment destroyed. The environments are
// no-op goroutines in this process with their own connect client and TLS connection.
//
// Besides the rate it reports what explains it: the rate of each serial stage (claims by the
// scheduler's fetch loop, starts by the pod worker's dispatch loop), the CPU time the process
// spent per lifecycle and on average (environments' client side included), the median time
// of one JetStream read during the run, and JetStream traffic per lifecycle.
func BenchmarkLifecycles(b *testing.B) {
	p := newPlane(b)
	target := p.target
	backend := newLocalBackend(func(ctx context.Context, spec envSpec) error {
		return runEnv(ctx, target, spec, envFinish, nil)
	})
	p.start(planeConfig{Concurrency: lifecycleConcurrency, Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, backend)
	b.Logf("load average before: %s", loadAvg())

	before, cpu0 := p.counts(), cpuTime()
	probe := p.probeRTT()
	var elapsed time.Duration
	var claimSpan, startSpan time.Duration
	done := 0
	for range b.N {
		began := time.Now()
		p.forge.release(lifecycleTasks)
		done += lifecycleTasks
		p.waitFor(5*time.Minute, func() bool {
			backend.checkDoubles(b)
			return p.n(assignment.Completed) >= done
		}, func() string {
			n, err := backend.launchErr()
			return fmt.Sprintf("%s; %d environments failed, first: %v", p, n, err)
		})
		elapsed += time.Since(began)
		_, lastClaim := p.seenOf(assignment.Claimed)
		_, lastStart := p.seenOf(assignment.Started)
		claimSpan += lastClaim.Sub(began)
		startSpan += lastStart.Sub(began)
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	rtt, probes := probe.end()
	b.Logf("load average after: %s", loadAvg())
	failed, first := backend.launchErr()
	require.Zero(b, failed, "environments failed; first: %v", first)
	require.Equal(b, int64(done), p.forge.successes.Load(), "successes the forge saw")
	d := p.counts().sub(before)
	d.api -= uint64(probes)
	_, kinds := p.apiReqs.snapshot()
	b.Logf("JetStream API requests by kind (whole run): %v", kinds)
	b.Logf("JetStream writes (whole run): assignments %d, dispatch %d, tasks %d, live %d, workers %d, environments %d",
		d.assignments, d.dispatch, d.tasks, d.live, d.workers, d.envs)
	n := float64(done)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(n/elapsed.Seconds(), "lifecycles/s")
	b.ReportMetric(n/claimSpan.Seconds(), "claims/s")
	b.ReportMetric(n/startSpan.Seconds(), "starts/s")
	b.ReportMetric(float64(cpu.Milliseconds())/n, "cpu-ms/lifecycle")
	b.ReportMetric(cpu.Seconds()/elapsed.Seconds(), "cpu-cores")
	b.ReportMetric(float64(rtt.Microseconds())/1000, "js-read-ms")
	b.ReportMetric(float64(d.assignments)/n, "appends/lifecycle")
	b.ReportMetric(float64(d.writes())/n, "js-writes/lifecycle")
	b.ReportMetric(float64(d.api)/n, "js-api/lifecycle")
}

// BenchmarkLifecyclesSplit is BenchmarkLifecycles with the facade and the environments in
// processes of their own, as a fleet deploys them: the measured process is the controller
// without its facade (embedded JetStream, served on loopback, the view, the scheduler and the
// pod worker), a facade host serves the environments (COMPONENTS=facade against the
// controller's server, its reports going to a stand-in forge in that host), and an
// environment host runs them (one goroutine each, as in BenchmarkMemory10k, finishing their
// job). The three share the machine's cores; each one's CPU per lifecycle is reported, the
// controller's (cpu-ms/lifecycle) being what sizes a controller host.
func BenchmarkLifecyclesSplit(b *testing.B) {
	p := newListeningPlane(b)
	cfg := planeConfig{Concurrency: lifecycleConcurrency, Lease: 5 * time.Minute, Pickup: 2 * time.Minute, NoFacade: true}
	fh := startFacadeHost(b, p, cfg.Lease, true)
	var host *envHost
	backend := newRemoteBackend(func(spec envSpec) { host.send(spec) })
	host = startEnvHostWith(b, p.target, p.poke, backend.exited)
	p.start(cfg, backend)
	b.Logf("load average before: %s", loadAvg())

	cpu0, facade0, env0 := cpuTime(), childCPU(b, fh.pid()), childCPU(b, host.pid())
	var elapsed time.Duration
	done := 0
	for range b.N {
		began := time.Now()
		p.forge.release(lifecycleTasks)
		done += lifecycleTasks
		p.waitFor(5*time.Minute, func() bool {
			n, first := host.failure()
			require.Zero(b, n, "environments failed; first: %s", first)
			backend.checkDoubles(b)
			return p.n(assignment.Completed) >= done
		}, func() string {
			return fmt.Sprintf("%s; environments done %d", p, p.n(assignment.Completed))
		})
		elapsed += time.Since(began)
	}
	b.StopTimer()
	cpu, facade, env := cpuTime()-cpu0, childCPU(b, fh.pid())-facade0, childCPU(b, host.pid())-env0
	b.Logf("load average after: %s", loadAvg())
	host.close()
	successes, err := fh.successes()
	require.NoError(b, err)
	require.EqualValues(b, done, successes, "successes the facade host's forge saw")
	n := float64(done)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(n/elapsed.Seconds(), "lifecycles/s")
	b.ReportMetric(float64(cpu.Microseconds())/1000/n, "cpu-ms/lifecycle")
	b.ReportMetric(float64(facade.Microseconds())/1000/n, "facade-cpu-ms/lifecycle")
	b.ReportMetric(float64(env.Microseconds())/1000/n, "env-cpu-ms/lifecycle")
	b.ReportMetric((cpu+facade+env).Seconds()/elapsed.Seconds(), "cpu-cores")
}

// childCPU is the CPU time process pid has used.
func childCPU(b *testing.B, pid string) time.Duration {
	b.Helper()
	d, err := procCPU(pid)
	require.NoError(b, err)
	return d
}
