package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/devforge"
)

// TestFairAdmissionAcrossOwners: a pod tier of capacity 2 on the real Gitea. Owner alpha pushes
// 20 jobs, and once dynrunner holds all of them, owner beta pushes 2. First in, first out,
// beta's jobs start after alpha's twenty; with FAIRNESS=owner beta's first job starts within
// the next two slots that free; with FAIR_SHARE_CAP=1 alpha never holds more than one
// environment. Every job ends green. The order is read from the event log (`dynrunner events`),
// where each admission and each end has its place.
func TestFairAdmissionAcrossOwners(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)
	const alphaJobs, betaJobs = 20, 2
	for _, tc := range []struct {
		name  string
		env   []string
		check func(t *testing.T, o admissionOrder)
	}{
		{"fifo", nil, func(t *testing.T, o admissionOrder) {
			assert.Equal(t, alphaJobs, o.alphaBeforeBeta, "first in, first out: beta's first job did not wait for alpha's twenty")
		}},
		{"owner", []string{"FAIRNESS=owner"}, func(t *testing.T, o admissionOrder) {
			assert.LessOrEqual(t, o.alphaAfterBetaClaimed, 1, "FAIRNESS=owner: beta's first job did not start within the next two free slots")
		}},
		{"share-cap", []string{"FAIRNESS=owner", "FAIR_SHARE_CAP=1"}, func(t *testing.T, o admissionOrder) {
			assert.Equal(t, 1, o.alphaMaxInFlight, "FAIR_SHARE_CAP=1: alpha held more than one environment (or never one)")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			alpha, err := f.CreateOrgRepo(ctx, "alpha-"+tc.name, "app")
			require.NoError(t, err)
			beta, err := f.CreateOrgRepo(ctx, "beta-"+tc.name, "lib")
			require.NoError(t, err)
			c := newController(t, tools, f, "", append([]string{leaseEnv, pickupEnv, "POD_CONCURRENCY=2", "MAX_QUEUED=30"}, tc.env...)...)
			c.start()

			shaA, err := f.PushWorkflow(ctx, alpha, ".gitea/workflows/many.yml", manyJobs(alphaJobs))
			require.NoError(t, err)
			if tc.name == "fifo" {
				assertAutoscaleWhileQueued(t, c)
			}
			// Beta pushes once dynrunner holds all of alpha's jobs, so the order is dynrunner's.
			deadline := time.Now().Add(3 * time.Minute)
			for claims(readRecords(t, c), alpha.String()) < alphaJobs {
				require.False(t, time.Now().After(deadline), "dynrunner did not claim alpha's %d jobs within 3 minutes", alphaJobs)
				time.Sleep(500 * time.Millisecond)
			}
			shaB, err := f.PushWorkflow(ctx, beta, ".gitea/workflows/many.yml", manyJobs(betaJobs))
			require.NoError(t, err)

			for _, r := range []struct {
				repo devforge.Repo
				sha  string
				n    int
			}{{alpha, shaA, alphaJobs}, {beta, shaB, betaJobs}} {
				run := waitRun(t, f, r.repo, r.sha, 10*time.Minute)
				require.Len(t, run.Jobs, r.n, "%s", r.repo)
				for _, j := range run.Jobs {
					assert.Equal(t, "success", j.Conclusion, "%s job %s", r.repo, j.Name)
				}
			}
			o := orderOf(t, readRecords(t, c), alpha.String(), beta.String())
			t.Logf("%s: alpha admitted before beta's first: %d; after beta was claimed: %d; alpha's most in flight: %d; admission order: %s",
				tc.name, o.alphaBeforeBeta, o.alphaAfterBetaClaimed, o.alphaMaxInFlight, o.sequence)
			tc.check(t, o)
			assertSizingMetrics(t, c, alphaJobs+betaJobs)
			assertNoEnvironmentsLeft(t, c)
		})
	}
}

// manyJobs is a workflow of n independent pod jobs.
func manyJobs(n int) string {
	var b strings.Builder
	b.WriteString("name: many\non: [push]\njobs:\n")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "  j%02d:\n    runs-on: [self-hosted, pod]\n    steps:\n      - run: sleep 1; echo job %d done\n", i, i)
	}
	return b.String()
}

// record is one line of `dynrunner events --json`.
type record struct {
	Seq uint64 `json:"seq"`
	assignment.Record
}

// readRecords reads the controller's assignment records in stream order.
func readRecords(t *testing.T, c *controller) []record {
	t.Helper()
	cmd := exec.Command(controllerBin(t), "events", "--json", "--follow=false", "--environments=false")
	cmd.Env = c.env
	out, err := cmd.Output()
	require.NoError(t, err, "dynrunner events")
	var recs []record
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		var r record
		require.NoError(t, json.Unmarshal([]byte(line), &r), "%s", line)
		recs = append(recs, r)
	}
	return recs
}

func claims(recs []record, repo string) int {
	n := 0
	for _, r := range recs {
		if r.Transition == assignment.Claimed && r.Repo == repo {
			n++
		}
	}
	return n
}

// admissionOrder is what the event log says about the order jobs got capacity.
type admissionOrder struct {
	// alphaBeforeBeta: alpha's admissions before beta's first; alphaAfterBetaClaimed: alpha's
	// admissions between beta's first claim and beta's first admission.
	alphaBeforeBeta, alphaAfterBetaClaimed int
	// alphaMaxInFlight: the most environments alpha held at once (admitted, not yet ended).
	alphaMaxInFlight int
	sequence         string
}

func orderOf(t *testing.T, recs []record, alpha, beta string) admissionOrder {
	t.Helper()
	var o admissionOrder
	betaClaimed, betaAdmitted := false, false
	inFlight := map[assignment.TaskID]bool{}
	alphaNow := 0
	var seq []string
	for _, r := range recs {
		// Capacity is taken by a claim that did not queue, or by an admission; given back by
		// the assignment's end.
		takes := (r.Transition == assignment.Claimed && r.Phase == assignment.Claimed) || r.Transition == assignment.Admitted
		ends := r.Transition == assignment.Completed || r.Transition == assignment.Failed
		if r.Transition == assignment.Claimed && r.Repo == beta {
			betaClaimed = true
		}
		switch {
		case takes:
			inFlight[r.Task] = true
			seq = append(seq, strings.SplitN(r.Repo, "-", 2)[0])
			switch r.Repo {
			case alpha:
				alphaNow++
				o.alphaMaxInFlight = max(o.alphaMaxInFlight, alphaNow)
				if !betaAdmitted {
					o.alphaBeforeBeta++
					if betaClaimed {
						o.alphaAfterBetaClaimed++
					}
				}
			case beta:
				betaAdmitted = true
			}
		case ends && inFlight[r.Task]:
			delete(inFlight, r.Task)
			if r.Repo == alpha {
				alphaNow--
			}
		}
	}
	require.True(t, betaAdmitted, "beta's jobs were never admitted")
	o.sequence = strings.Join(seq, ",")
	return o
}

// assertAutoscaleWhileQueued reads GET /v1/fleet/autoscale and /metrics while most of twenty
// jobs wait for one pod worker of two slots: the pod tier wants more workers, and says why.
func assertAutoscaleWhileQueued(t *testing.T, c *controller) {
	t.Helper()
	type tier struct {
		DesiredWorkers int    `json:"desired_workers"`
		Reason         string `json:"reason"`
		Queued         int    `json:"queued"`
		InFlight       int    `json:"in_flight"`
		Workers        int    `json:"workers"`
		Slots          int    `json:"slots"`
	}
	read := func() (tier, bool) {
		resp, err := http.Get(c.httpURL + "/v1/fleet/autoscale")
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var answer struct {
			Tiers map[string]tier `json:"tiers"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
		pod, ok := answer.Tiers["pod"]
		return pod, ok
	}
	// Read while alpha's jobs queue: the endpoint is polled from the first claims on, so a
	// slow machine that lags reading the records does not miss the queue.
	var pod tier
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var ok bool
		pod, ok = read()
		require.True(t, ok, "no pod tier in the autoscaling decision")
		if pod.Queued >= 12 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("GET /v1/fleet/autoscale while queued: pod %+v", pod)
	// Jobs end meanwhile: of the twenty, most wait, at most two hold the slots.
	assert.GreaterOrEqual(t, pod.Queued, 12, "the jobs past the two slots do not show as queued")
	assert.LessOrEqual(t, pod.InFlight, 2)
	assert.Equal(t, 1, pod.Workers)
	assert.Equal(t, 2, pod.Slots)
	want := (pod.Queued + pod.InFlight + 1) / 2
	assert.Equal(t, want, pod.DesiredWorkers, "queued and in-flight jobs over workers of two slots")
	assert.Contains(t, pod.Reason, fmt.Sprintf("%d queued, %d in flight, 1 worker of 2 slots online: want %d more", pod.Queued, pod.InFlight, want-1))

	m, err := http.Get(c.httpURL + "/metrics")
	require.NoError(t, err)
	defer m.Body.Close()
	body, err := io.ReadAll(m.Body)
	require.NoError(t, err)
	assert.Regexp(t, `dynrunner_autoscale_desired_workers\{backend="pod"\} ([5-9]|1[0-9])\n`, string(body))
	assert.Contains(t, string(body), `dynrunner_assignments_queued{backend="pod"}`)
}

// assertSizingMetrics scrapes /metrics after n jobs ended green and checks the metrics people
// size a fleet by: each job's environment start, its wait from claim to start, its duration by
// result, and the admission waits of the jobs that queued, by owner.
func assertSizingMetrics(t *testing.T, c *controller, n int) {
	t.Helper()
	resp, err := http.Get(c.httpURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	body := string(b)
	for _, series := range []string{
		`dynrunner_environment_start_seconds_count{backend="local",tier="pod"} %d`,
		`dynrunner_queue_to_start_seconds_count{backend="local",tier="pod"} %d`,
		`dynrunner_job_duration_seconds_count{result="success",tier="pod"} %d`,
	} {
		assert.Contains(t, body, fmt.Sprintf(series, n))
	}
	assert.Regexp(t, `dynrunner_admission_wait_seconds_count\{backend="pod",owner="alpha-[a-z-]+"\} \d+`, body,
		"no admission waits of the owner whose jobs queued")
}
