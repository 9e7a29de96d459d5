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
