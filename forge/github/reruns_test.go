package github_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github"
	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/assignment"
)

// rerunPoll is the tests' Reruns.Poll: passes every few milliseconds.
const rerunPoll = 20 * time.Millisecond

// reruns returns a replica's Reruns on b, with its own metrics.
func (b *bed) reruns(actor string, bound int, hold time.Duration) (*github.Reruns, *github.Metrics) {
	m := github.NewMetrics(nil)
	return github.NewReruns(github.RerunsConfig{KV: b.log.GitHubReruns(), Events: b.log, Clients: b.clients, Max: bound,
		Actor: actor, Poll: rerunPoll, Hold: hold, Log: zerolog.Nop(), Metrics: m}), m
}

// rerunRecord reads run's record; false when it has none. Not under the test's context: a
// polling condition may still run for a moment after the test ended.
func (b *bed) rerunRecord(t *testing.T, run int64) (github.Rerun, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := b.log.GitHubReruns().Get(ctx, github.RerunKey(run))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return github.Rerun{}, false
	}
	require.NoError(t, err)
	var r github.Rerun
	require.NoError(t, json.Unmarshal(e.Value(), &r))
	return r, true
}

// waitRecord waits until run's record satisfies ok.
func (b *bed) waitRecord(t *testing.T, run int64, what string, ok func(github.Rerun) bool) github.Rerun {
	t.Helper()
	var last atomic.Pointer[github.Rerun]
	if !assert.Eventually(t, func() bool {
		r, found := b.rerunRecord(t, run)
		last.Store(&r)
		return found && ok(r)
	}, 20*time.Second, 10*time.Millisecond, what) {
		require.FailNow(t, what, "the last record read: %+v", last.Load())
	}
	return *last.Load()
}

func (b *bed) run(t *testing.T, id int64) githubtest.WorkflowRun {
	t.Helper()
	r, err := b.srv.WorkflowRun(id)
	require.NoError(t, err)
	return r
}

// newRerunBed is a slot bed whose slots note lost environments to a replica's Reruns.
func newRerunBed(t *testing.T, bound int) (*slotBed, *github.Reruns, *github.Metrics) {
	t.Helper()
	var r *github.Reruns
	var m *github.Metrics
	sb := newSlotBed(t, 4, func(b *bed, cfg *github.SlotsConfig) {
		r, m = b.reruns("scheduler@test", bound, 5*time.Second)
		cfg.Reruns = r
	})
	return sb, r, m
}

// loseEnvironment waits for a configured slot other than those in not, starts job on its
// runner (GitHub gives it the job), waits for JobStarted to be recorded, then fails the slot as
// the pod worker does when its environment is evicted.
func (b *slotBed) loseEnvironment(t *testing.T, job int64, not ...assignment.TaskID) assignment.State {
	t.Helper()
	var slot assignment.State
	require.Eventually(t, func() bool {
		for _, st := range b.live() {
			if st.Ready() && st.Phase == assignment.Claimed && !slices.Contains(not, st.Task) {
				slot = st
				return true
			}
		}
		return false
	}, 15*time.Second, 20*time.Millisecond, "no slot for job %d", job)
	_, err := b.srv.StartJob(job, int(slot.RunnerID))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.state(t, slot.Task).Phase == assignment.Running }, 10*time.Second, 20*time.Millisecond,
		"JobStarted was not recorded")
	st := b.state(t, slot.Task)
	st, err = b.log.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: st.Task, Epoch: st.Epoch(), Actor: "pod-worker@test",
		At: time.Now(), Reason: "the environment ended (evicted, exit code -1) before the job completed", Lost: true}, &st)
	require.NoError(t, err)
	return st
}

// TestRerunAfterLostEnvironment: a slot whose environment is lost after its runner took a job
// is noted in its run's record; nothing is asked of GitHub while the run is in progress (the
// lost job runs on at GitHub until GitHub gives up on its runner); once the run completed,
// rerun-failed-jobs is called exactly once, the rerun's job reaches the scale set again, and
// the outcome is recorded and counted.
func TestRerunAfterLostEnvironment(t *testing.T) {
	b, reruns, m := newRerunBed(t, 2)
	run(t, b.sess)
	run(t, reruns)
	const runID = 501
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Repository: "app", WorkflowRunID: runID})
	require.NoError(t, err)
	lost := b.loseEnvironment(t, job)
	assert.Equal(t, "octo/app", lost.Repo)
	assert.EqualValues(t, runID, lost.RunID)

	rec := b.waitRecord(t, runID, "the lost slot was not noted with its run's attempt", func(r github.Rerun) bool { return r.Attempt == 1 })
	assert.Equal(t, github.RerunPending, rec.State)
	assert.Equal(t, "octo/app", rec.Repo)
	assert.Equal(t, []assignment.TaskID{lost.Task}, rec.Slots)
	reads := b.srv.Requests(githubtest.OpGetWorkflowRun)
	require.Eventually(t, func() bool { return b.srv.Requests(githubtest.OpGetWorkflowRun) >= reads+3 }, 10*time.Second, 10*time.Millisecond)
	assert.Zero(t, b.srv.Requests(githubtest.OpRerunFailedJobs), "a rerun was asked while the run was in progress")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.RerunsPending))

	// GitHub gives up on the lost runner: the job fails, the run completes.
	require.NoError(t, b.srv.CompleteJob(job, "failed"))
	rec = b.waitRecord(t, runID, "the rerun was not asked", func(r github.Rerun) bool { return r.State == github.RerunAsked })
	assert.Equal(t, github.OutcomeRerun, rec.Outcome)
	assert.Equal(t, 1, rec.Reruns)
	assert.Equal(t, 1, rec.Attempt)
	assert.Equal(t, "scheduler@test", rec.Asker)
	assert.Equal(t, 1, b.run(t, runID).Reruns)
	assert.Equal(t, 2, b.run(t, runID).Attempt)
	jobs := b.srv.RunJobs(runID)
	require.Len(t, jobs, 2)
	assert.Equal(t, 2, jobs[1].Attempt)
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.Reruns.WithLabelValues(github.OutcomeRerun)) == 1 },
		5*time.Second, 10*time.Millisecond, "the rerun was not counted") // counted once recorded

	// The rerun's job gets a slot of its own; no second call is made meanwhile.
	require.Eventually(t, func() bool {
		j, err := b.srv.Job(jobs[1].ID)
		return err == nil && j.State == githubtest.JobAssigned
	}, 10*time.Second, 20*time.Millisecond, "the rerun's job did not reach the scale set")
	reads = b.srv.Requests(githubtest.OpGetWorkflowRun)
	require.Eventually(t, func() bool { return len(b.live()) >= 2 }, 10*time.Second, 20*time.Millisecond, "the rerun's job got no slot")
	assert.Equal(t, 1, b.srv.Requests(githubtest.OpRerunFailedJobs), "rerun-failed-jobs was called more than once")
	assert.Equal(t, reads, b.srv.Requests(githubtest.OpGetWorkflowRun), "a final record's run was still read")
}

// TestNoRerunForAJobThatFailedOnItsOwn: a job that failed by itself completes its slot with
// GitHub's result; no record is made, GitHub is not asked, and Note ignores every failure that
// is not a lost environment after JobStarted.
func TestNoRerunForAJobThatFailedOnItsOwn(t *testing.T) {
	b, reruns, _ := newRerunBed(t, 2)
	run(t, b.sess)
	run(t, reruns)
	const runID = 502
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, WorkflowRunID: runID})
	require.NoError(t, err)
	var slot assignment.State
	require.Eventually(t, func() bool {
		live := b.live()
		if len(live) == 1 && live[0].Ready() {
			slot = live[0]
		}
		return slot.Task != 0
	}, 15*time.Second, 20*time.Millisecond)
	_, err = b.srv.StartJob(job, int(slot.RunnerID))
	require.NoError(t, err)
	require.NoError(t, b.srv.CompleteJob(job, "failed"))
	require.Eventually(t, func() bool { return b.state(t, slot.Task).Phase == assignment.Completed }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, "failed", b.state(t, slot.Task).Result)
	assert.Equal(t, githubtest.ConclusionFailure, b.run(t, runID).Conclusion)
	require.Eventually(t, func() bool { return b.srv.PendingMessages(b.pod.ID) == 0 }, 10*time.Second, 20*time.Millisecond)

	// Every failure but a lost environment after JobStarted is left alone.
	running := b.state(t, slot.Task)
	for name, st := range map[string]assignment.State{
		"completed":                         running,
		"failed, not lost":                  withFailure(running, false, "job-1", runID),
		"lost before its runner took a job": withFailure(running, true, "", 0),
	} {
		require.NoError(t, reruns.Note(t.Context(), st), name)
	}
	assert.Never(t, func() bool { _, found := b.rerunRecord(t, runID); return found }, 500*time.Millisecond, 20*time.Millisecond,
		"a job that failed by itself was noted for a rerun")
	_, found := b.rerunRecord(t, 0)
	assert.False(t, found)
	assert.Zero(t, b.srv.Requests(githubtest.OpRerunFailedJobs))
}

func withFailure(st assignment.State, lost bool, job string, run int64) assignment.State {
	st.Phase, st.Transition, st.Lost, st.GitHubJob, st.RunID = assignment.Failed, assignment.Failed, lost, job, run
	return st
}

// TestRerunBound: with GITHUB_RERUNS=1, a run whose rerun lost its environment again is not
// rerun a second time: the second round ends `bound`, and GitHub was called once.
func TestRerunBound(t *testing.T) {
	b, reruns, m := newRerunBed(t, 1)
	run(t, b.sess)
	run(t, reruns)
	const runID = 503
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, WorkflowRunID: runID})
	require.NoError(t, err)
	first := b.loseEnvironment(t, job)
	b.waitRecord(t, runID, "the first loss was not noted", func(r github.Rerun) bool { return r.Attempt == 1 })
	require.NoError(t, b.srv.CompleteJob(job, "failed"))
	b.waitRecord(t, runID, "the first rerun was not asked", func(r github.Rerun) bool { return r.State == github.RerunAsked })

	again := b.srv.RunJobs(runID)[1]
	require.Equal(t, 2, again.Attempt)
	require.Eventually(t, func() bool { j, _ := b.srv.Job(again.ID); return j.State == githubtest.JobAssigned }, 10*time.Second, 20*time.Millisecond)
	second := b.loseEnvironment(t, again.ID, first.Task)
	rec := b.waitRecord(t, runID, "the second loss did not begin a round for attempt 2",
		func(r github.Rerun) bool { return r.State == github.RerunPending && r.Attempt == 2 })
	assert.Contains(t, rec.Slots, second.Task)
	require.NoError(t, b.srv.CompleteJob(again.ID, "failed"))
	rec = b.waitRecord(t, runID, "the second round was not skipped", func(r github.Rerun) bool { return r.State == github.RerunSkipped })
	assert.Equal(t, github.OutcomeBound, rec.Outcome)
	assert.Contains(t, rec.Reason, "GITHUB_RERUNS=1")
	assert.Equal(t, 1, rec.Reruns)
	assert.Equal(t, 1, b.srv.Requests(githubtest.OpRerunFailedJobs), "the bound did not hold")
	assert.Equal(t, 2, b.run(t, runID).Attempt)
	require.Eventually(t, func() bool { return testutil.ToFloat64(m.Reruns.WithLabelValues(github.OutcomeBound)) == 1 },
		5*time.Second, 10*time.Millisecond, "the bound was not counted")
}

// lostSlot appends the records of slot n that lost its environment after its runner took a
// job of run in repo, as the session holder and the pod worker would.
func (b *bed) lostSlot(t *testing.T, n int64, run int64, repo string) assignment.State {
	t.Helper()
	ctx := t.Context()
	id := assignment.SlotBase + assignment.TaskID(n)
	st, err := b.log.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: id, Backend: assignment.BackendPod, Actor: "scheduler@test",
		At: time.Now(), Forge: assignment.ForgeGitHub, ScaleSet: 1, RunnerName: fmt.Sprintf("dynrunner-pod-%d", n), Lease: time.Hour, Pickup: 10 * time.Minute}, nil)
	require.NoError(t, err)
	for _, ev := range []assignment.Event{
		{Transition: assignment.Configured, RunnerID: 40 + n, TaskDigest: "d"},
		{Transition: assignment.Running, RunnerID: 40 + n, GitHubJob: fmt.Sprintf("job-%d", n), RunID: run, Repo: repo},
		{Transition: assignment.Failed, Reason: "evicted", Lost: true},
	} {
		ev.Task, ev.Epoch, ev.Actor, ev.At = id, st.Epoch(), "test", time.Now()
		st, err = b.log.Apply(ctx, ev, &st)
		require.NoError(t, err)
	}
	return st
}

// failedRun queues a job in run runID of octo/hello and fails it: the run completed with a
// failure.
func (b *bed) failedRun(t *testing.T, runID int64) int64 {
	t.Helper()
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, WorkflowRunID: runID})
	require.NoError(t, err)
	require.NoError(t, b.srv.CompleteJob(job, "failed"))
	return job
}

// TestRerunReplicasRace: two replicas follow the same runs; every run is rerun by exactly one
// call, the record naming the replica that made it.
func TestRerunReplicasRace(t *testing.T) {
	b := newSlotBed(t, 0).bed
	a, _ := b.reruns("scheduler@a", 2, 5*time.Second)
	c, _ := b.reruns("scheduler@c", 2, 5*time.Second)
	const runs = 8
	for i := range int64(runs) {
		b.failedRun(t, 600+i)
		require.NoError(t, a.Note(t.Context(), b.lostSlot(t, i+1, 600+i, "octo/hello")))
	}
	run(t, a)
	run(t, c)
	askers := map[string]int{}
	for i := range int64(runs) {
		rec := b.waitRecord(t, 600+i, "a run was not rerun", func(r github.Rerun) bool { return r.State == github.RerunAsked })
		askers[rec.Asker]++
		assert.Equal(t, 1, rec.Reruns)
	}
	require.Eventually(t, func() bool { return b.srv.Requests(githubtest.OpRerunFailedJobs) >= runs }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, runs, b.srv.Requests(githubtest.OpRerunFailedJobs), "two replicas asked for one run's rerun")
	for i := range int64(runs) {
		assert.Equal(t, 1, b.run(t, 600+i).Reruns, "run %d", 600+i)
	}
	t.Logf("calls by replica: %v", askers)
}

// TestRerunAfterACrash: a replica that dies after noting the loss, after claiming the call, or
// after GitHub accepted the call but before it heard so, leaves a record another replica
// finishes: exactly one call to GitHub in each case.
func TestRerunAfterACrash(t *testing.T) {
	t.Run("after the intent", func(t *testing.T) {
		b := newSlotBed(t, 0).bed
		dead, _ := b.reruns("scheduler@dead", 2, 5*time.Second)
		require.NoError(t, dead.Note(t.Context(), b.lostSlot(t, 1, 700, "octo/hello"))) // and never runs
		b.failedRun(t, 700)
		next, _ := b.reruns("scheduler@next", 2, 5*time.Second)
		run(t, next)
		rec := b.waitRecord(t, 700, "the next replica did not rerun", func(r github.Rerun) bool { return r.State == github.RerunAsked })
		assert.Equal(t, "scheduler@next", rec.Asker)
		assert.Equal(t, 1, b.srv.Requests(githubtest.OpRerunFailedJobs))
	})
	t.Run("after the claim", func(t *testing.T) {
		b := newSlotBed(t, 0).bed
		lost := b.lostSlot(t, 1, 701, "octo/hello")
		b.failedRun(t, 701)
		claimed := github.Rerun{Run: 701, Repo: "octo/hello", State: github.RerunAsking, Slots: []assignment.TaskID{lost.Task}, Since: time.Now(),
			Attempt: 1, Asker: "scheduler@dead", AskUntil: time.Now().Add(time.Second), DecidedAt: time.Now(), Actor: "scheduler@dead", At: time.Now()}
		data, err := json.Marshal(claimed)
		require.NoError(t, err)
		_, err = b.log.GitHubReruns().Create(t.Context(), github.RerunKey(701), data)
		require.NoError(t, err)
		next, _ := b.reruns("scheduler@next", 2, 5*time.Second)
		run(t, next)
		rec := b.waitRecord(t, 701, "the claim of a dead replica was not taken over", func(r github.Rerun) bool { return r.State == github.RerunAsked })
		assert.Equal(t, "scheduler@next", rec.Asker)
		assert.Equal(t, 1, b.srv.Requests(githubtest.OpRerunFailedJobs))
	})
	t.Run("after the call", func(t *testing.T) {
		b := newSlotBed(t, 0).bed
		stalled := make(chan struct{})
		b.srv.InjectFault(githubtest.OpRerunFailedJobs, githubtest.Fault{Withhold: true, Stalled: stalled})
		b.failedRun(t, 702)
		dead, _ := b.reruns("scheduler@dead", 2, 4*time.Second)
		require.NoError(t, dead.Note(t.Context(), b.lostSlot(t, 1, 702, "octo/hello")))
		kill := run(t, dead)
		select {
		case <-stalled: // GitHub made the rerun; its answer never reaches the replica
		case <-time.After(20 * time.Second):
			require.FailNow(t, "the first replica did not call")
		}
		kill()
		rec, _ := b.rerunRecord(t, 702)
		require.Equal(t, github.RerunAsking, rec.State, "the killed replica recorded something after its call")
		require.Equal(t, 2, b.run(t, 702).Attempt)

		next, _ := b.reruns("scheduler@next", 2, 4*time.Second)
		run(t, next)
		rec = b.waitRecord(t, 702, "the next replica did not record the rerun", func(r github.Rerun) bool { return r.State == github.RerunAsked })
		assert.Equal(t, "scheduler@dead", rec.Asker, "the rerun is not the dead replica's")
		assert.Equal(t, "scheduler@next", rec.Actor)
		assert.Equal(t, 1, rec.Reruns)
		assert.Equal(t, 1, b.srv.Requests(githubtest.OpRerunFailedJobs), "the rerun was asked twice")
		assert.Equal(t, 1, b.run(t, 702).Reruns)
	})
}

// TestRerunRefusesForgedRecords: a record in the bucket that no authentic record of a lost
// slot backs (written by someone with NATS access but without the event log's key, or naming
// another run or repository than its slot's) makes dynrunner call nothing at GitHub.
func TestRerunRefusesForgedRecords(t *testing.T) {
	b := newSlotBed(t, 0).bed
	b.failedRun(t, 800)
	b.failedRun(t, 801)
	other := b.lostSlot(t, 1, 801, "octo/hello") // authentic, but for run 801
	kv := b.log.GitHubReruns()
	for _, rec := range []github.Rerun{
		{Run: 800, Repo: "octo/hello", State: github.RerunPending, Slots: []assignment.TaskID{assignment.SlotBase + 99}, Since: time.Now(), At: time.Now()},
		{Run: 800, Repo: "octo/hello", State: github.RerunPending, Slots: []assignment.TaskID{other.Task}, Since: time.Now(), At: time.Now()},
	} {
		data, err := json.Marshal(rec)
		require.NoError(t, err)
		_, err = kv.Put(t.Context(), github.RerunKey(800), data)
		require.NoError(t, err)
		r, m := b.reruns("scheduler@test", 2, 5*time.Second)
		stop := run(t, r)
		got := b.waitRecord(t, 800, "the forged record was not refused", func(r github.Rerun) bool { return r.State == github.RerunSkipped })
		stop()
		assert.Equal(t, github.OutcomeRefused, got.Outcome)
		assert.Equal(t, 1.0, testutil.ToFloat64(m.Reruns.WithLabelValues(github.OutcomeRefused)))
	}
	assert.Zero(t, b.srv.Requests(githubtest.OpGetWorkflowRun), "a forged record made dynrunner read a run")
	assert.Zero(t, b.srv.Requests(githubtest.OpRerunFailedJobs), "a forged record made dynrunner rerun a run")
}

// TestRerunRetriesFailedCalls: GitHub answering 502 to the call leaves the round pending with
// the try counted; the next try, after a pause, reruns the run.
func TestRerunRetriesFailedCalls(t *testing.T) {
	b := newSlotBed(t, 0).bed
	b.srv.FailOnce(githubtest.OpRerunFailedJobs, http.StatusBadGateway)
	b.failedRun(t, 900)
	r, m := b.reruns("scheduler@test", 2, 5*time.Second)
	require.NoError(t, r.Note(t.Context(), b.lostSlot(t, 1, 900, "octo/hello")))
	run(t, r)
	rec := b.waitRecord(t, 900, "the run was not rerun after a failed call", func(r github.Rerun) bool { return r.State == github.RerunAsked })
	assert.Equal(t, 1, rec.Tries)
	assert.Contains(t, rec.LastError, "502")
	assert.Equal(t, 2, b.srv.Requests(githubtest.OpRerunFailedJobs))
	assert.Equal(t, 1, b.run(t, 900).Reruns)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.RerunErrors.WithLabelValues("rerun")))
}

// TestRerunGoneRun: a run GitHub does not know (deleted, or out of the credentials' reach)
// ends the round `gone` without a call.
func TestRerunGoneRun(t *testing.T) {
	b := newSlotBed(t, 0).bed
	r, _ := b.reruns("scheduler@test", 2, 5*time.Second)
	require.NoError(t, r.Note(context.Background(), b.lostSlot(t, 1, 999, "octo/hello")))
	run(t, r)
	rec := b.waitRecord(t, 999, "the unknown run was not given up", func(r github.Rerun) bool { return r.State == github.RerunSkipped })
	assert.Equal(t, github.OutcomeGone, rec.Outcome)
	assert.Zero(t, b.srv.Requests(githubtest.OpRerunFailedJobs))
}
