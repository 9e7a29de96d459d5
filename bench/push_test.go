package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/devforge"
)

// pushRounds is how many measured pushes each side gets per iteration; one unmeasured warm-up
// push per side comes first.
const pushRounds = 10

// pushWorkflow is the one-step job both sides run; n makes every push a new commit.
func pushWorkflow(n int) string {
	return fmt.Sprintf(`name: bench
on: [push]
jobs:
  hi:
    runs-on: [self-hosted, pod]
    steps:
      - run: echo hi
# push %d
`, n)
}

// fetchInterval is the static runner's poll interval (devforge writes fetch_interval: 1s);
// the controller polls Gitea at the same pace, so neither side is favoured by polling.
const fetchInterval = "1s"

// BenchmarkPushToSuccess measures, on one real Gitea, the wall time from the push of a
// one-step workflow to its run being completed with success: repository A is served by a
// static gitea-runner in host mode, repository B by a dynrunner controller process (one-shot
// local environment per job). Pushes alternate between A and B.
func BenchmarkPushToSuccess(b *testing.B) {
	tools := needTools(b)
	bin := buildDynrunner(b)
	ctx := b.Context()
	forge, err := devforge.Start(ctx, tools, devforge.Options{Dir: b.TempDir()})
	require.NoError(b, err)
	b.Cleanup(func() { _ = forge.Close() })
	static, err := forge.CreateRepo(ctx, "static")
	require.NoError(b, err)
	dyn, err := forge.CreateRepo(ctx, "dynrunner")
	require.NoError(b, err)
	tok, err := forge.RunnerRegistrationToken(ctx, static.String())
	require.NoError(b, err)
	sr, err := devforge.StartStaticRunner(ctx, tools, forge.URL(), tok, executor.Labels(assignment.BackendPod),
		filepath.Join(b.TempDir(), "static"), nil)
	require.NoError(b, err)
	b.Cleanup(func() { _ = sr.Close() })
	ctl := startController(b, bin, tools, forge, dyn.String(), "FETCH_INTERVAL="+fetchInterval)

	push := 0
	measure := func(repo devforge.Repo) time.Duration {
		b.Helper()
		push++
		wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		began := time.Now()
		sha, err := forge.PushWorkflow(wctx, repo, ".gitea/workflows/bench.yml", pushWorkflow(push))
		require.NoError(b, err)
		run, err := forge.WaitRun(wctx, repo, sha)
		took := time.Since(began)
		if err != nil || !run.Succeeded() {
			b.Fatalf("%s push %d: run %+v, %v\ncontroller log:\n%s", repo, push, run, err, ctl.logTail(60))
		}
		return took
	}
	b.Logf("load average before: %s", loadAvg())
	b.Logf("warm-up: static %s, dynrunner %s", measure(static).Round(time.Millisecond), measure(dyn).Round(time.Millisecond))
	var st, dy []time.Duration
	b.ResetTimer()
	for range b.N {
		for range pushRounds {
			st = append(st, measure(static))
			dy = append(dy, measure(dyn))
		}
	}
	b.StopTimer()
	b.Logf("load average after: %s", loadAvg())
	b.Logf("static:    %v", roundAll(st))
	b.Logf("dynrunner: %v", roundAll(dy))
	ms, md := median(st), median(dy)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(ms.Seconds(), "static-s")
	b.ReportMetric(md.Seconds(), "dynrunner-s")
	b.ReportMetric(md.Seconds()/ms.Seconds(), "dynrunner/static")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
}
