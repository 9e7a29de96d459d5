package scheduler_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/dynrunner/dynrunner/forge/forgetest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/grants"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
	"github.com/dynrunner/dynrunner/scheduler"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (e *env) runScheduler(clk *clock) { e.runSchedulerWith(clk, nil) }

func (e *env) runSchedulerWith(clk *clock, capacity map[assignment.Backend]int) {
	e.runSchedulerPolicy(clk, capacity, nil)
}

func (e *env) runSchedulerPolicy(clk *clock, capacity map[assignment.Backend]int, policy *grants.Policy) {
	e.runSchedulerAdmission(clk, capacity, policy, scheduler.Admission{})
}

func (e *env) runSchedulerAdmission(clk *clock, capacity map[assignment.Backend]int, policy *grants.Policy, adm scheduler.Admission) *scheduler.Scheduler {
	e.t.Helper()
	s := scheduler.New(scheduler.Config{
		Capacity: capacity, Grants: policy, Admission: adm,
		Actor: "scheduler-test", Backends: []assignment.Backend{assignment.BackendPod},
		Lease: 5 * time.Minute, Pickup: 2 * time.Minute, FetchInterval: 20 * time.Millisecond, FetchIntervalMax: 100 * time.Millisecond,
		Keepalive: time.Minute, Reconcile: 20 * time.Millisecond, Box: e.box, Log: zerolog.New(zerolog.NewTestWriter(e.t)), Now: clk.Now,
	}, e.forge, e.log, e.view)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		assert.NoError(e.t, <-done, "Run on cancellation")
	})
	return s
}

// eventually polls cond every 10ms for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func taskWithRunsOn(id int64, runsOn string) *runnerv1.Task {
	t := forgetest.Task(id)
	t.WorkflowPayload = []byte("name: ci\njobs:\n  build:\n    name: build\n    runs-on: " + runsOn + "\n    steps:\n      - run: echo hi\n")
	return t
}

func TestSchedulerClaimsPersistsAndDispatches(t *testing.T) {
	e := newEnv(t)
	clk := &clock{now: time.Now()}
	e.runScheduler(clk)
	e.forge.Push(taskWithRunsOn(11, "[self-hosted, pod]"))
	var st assignment.State
	eventually(t, "the claim", func() bool {
		var err error
		st, err = e.log.Get(t.Context(), 11)
		return err == nil
	})
	require.Equal(t, assignment.BackendPod, st.Backend, "claim %+v: backend", st.Record)
	require.Equal(t, "o/r", st.Repo, "claim %+v: repo", st.Record)
	require.Equal(t, "build", st.Job, "claim %+v: job", st.Record)
	sealed, err := e.log.GetTask(t.Context(), 11)
	require.NoError(t, err)
	require.NotContains(t, string(sealed), "s3cr3t", "the stored task holds a secret in clear text")
	require.NotContains(t, string(sealed), "ghs_secret_token", "the stored task holds a secret in clear text")
	task, err := sealedtask.Open(e.box, 11, sealed, st.TaskDigest)
	require.NoError(t, err, "sealedtask.Open")
	require.Equal(t, "s3cr3t", task.GetSecrets()["API_KEY"], "sealedtask.Open = %v: the secret", task)
	cons, err := e.log.Consumer(t.Context(), assignment.BackendPod)
	require.NoError(t, err)
	msg, err := cons.Next()
	require.NoError(t, err)
	assert.Contains(t, string(msg.Data()), `"task_id":11`, "dispatch")
}

// TestSchedulerFailsOversizeTasksAtOnce: a task too large for the event bus (a 5 MB env in
// its secrets here) can never be stored. It is failed upstream at once, saying why, and the
// next task is claimed right after it, not after persistFor.
func TestSchedulerFailsOversizeTasksAtOnce(t *testing.T) {
	e := newEnv(t)
	e.runScheduler(&clock{now: time.Now()})
	big := taskWithRunsOn(31, "[self-hosted, pod]")
	big.Secrets["HUGE"] = strings.Repeat("x", 5<<20)
	e.forge.Push(big)
	e.forge.Push(taskWithRunsOn(32, "[self-hosted, pod]"))
	began := time.Now()
	eventually(t, "the oversize task failed upstream", func() bool { return e.forge.Result(31) == runnerv1.Result_RESULT_FAILURE })
	eventually(t, "the next task claimed", func() bool { _, err := e.log.Get(t.Context(), 32); return err == nil })
	took := time.Since(began)
	assert.LessOrEqual(t, took, 10*time.Second, "the next task waited %s behind the oversize one", took)
	log := strings.Join(e.forge.Log(31), "\n")
	assert.Contains(t, log, "dynrunner: this job was not run", "the oversize task's log does not say why it was not run")
	assert.Contains(t, log, "max_payload", "the oversize task's log does not say why it was not run")
	_, err := e.log.Get(t.Context(), 31)
	assert.ErrorIs(t, err, assignment.ErrNotFound, "the oversize task got an assignment")
	_, err = e.log.GetTask(t.Context(), 31)
	assert.ErrorIs(t, err, assignment.ErrNotFound, "the oversize task is stored")
}

func TestSchedulerRejectsUnroutableJobs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		runsOn string
	}{
		{"no isolation label", "[self-hosted]"},
		{"both tiers", "[self-hosted, pod, vm]"},
		{"vm without a vm backend", "[self-hosted, vm]"},
		{"unknown label", "[self-hosted, pod, gpu]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.runScheduler(&clock{now: time.Now()})
			e.forge.Push(taskWithRunsOn(21, tc.runsOn))
			eventually(t, "the upstream failure", func() bool { return e.forge.Result(21) == runnerv1.Result_RESULT_FAILURE })
			log := strings.Join(e.forge.Log(21), "\n")
			assert.Contains(t, log, "accepted: [self-hosted, pod]", "the log does not say which labels are accepted")
			_, err := e.log.Get(t.Context(), 21)
			assert.ErrorIs(t, err, assignment.ErrNotFound, "an unroutable task got an assignment")
		})
	}
}

// TestSchedulerRefusesJobsTheirGrantDoesNotCover: a job whose tier GRANTS_FILE does not
// grant its repository (here: a vm-only repository's pod job, and a pod job of a pull request
// from a fork, with forks bound to vm) is failed upstream with a message naming the grant, and
// never claimed; a pull request from a branch of the same repository is not a fork's.
func TestSchedulerRefusesJobsTheirGrantDoesNotCover(t *testing.T) {
	pullRequest := func(task *runnerv1.Task, head string) *runnerv1.Task {
		ev, err := structpb.NewStruct(map[string]any{"pull_request": map[string]any{
			"head": map[string]any{"repo": map[string]any{"full_name": head}},
			"base": map[string]any{"repo": map[string]any{"full_name": "o/r"}},
		}})
		require.NoError(t, err)
		task.Context.Fields["event_name"] = structpb.NewStringValue("pull_request")
		task.Context.Fields["event"] = structpb.NewStructValue(ev)
		return task
	}
	for _, tc := range []struct {
		name, policy, rule string
		task               *runnerv1.Task
	}{
		{"vm-only repository", "repositories:\n  o/r: [vm]\n", `repositories["o/r"]`, taskWithRunsOn(61, "[self-hosted, pod]")},
		{"vm-only owner", "owners:\n  O: [vm]\n", `owners["o"]`, taskWithRunsOn(61, "[self-hosted, pod]")},
		{"fork bound to vm", "forks: [vm]\n", "no rule and forks", pullRequest(taskWithRunsOn(61, "[self-hosted, pod]"), "stranger/r")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy, err := grants.Parse([]byte(tc.policy))
			require.NoError(t, err)
			e := newEnv(t)
			e.runSchedulerPolicy(&clock{now: time.Now()}, nil, policy)
			e.forge.Push(tc.task)
			e.forge.Push(pullRequest(taskWithRunsOn(62, "[self-hosted, pod]"), "O/R"))
			eventually(t, "the upstream failure", func() bool { return e.forge.Result(61) == runnerv1.Result_RESULT_FAILURE })
			log := strings.Join(e.forge.Log(61), "\n")
			assert.Contains(t, log, "dynrunner: this job was not run: isolation tier not granted: the job asks for pod, but grant "+tc.rule+" of GRANTS_FILE")
			assert.Contains(t, log, "use runs-on: [self-hosted, vm]")
			_, err = e.log.Get(t.Context(), 61)
			assert.ErrorIs(t, err, assignment.ErrNotFound, "a job its grant does not cover got an assignment")
			if tc.rule == "no rule and forks" {
				var st assignment.State
				eventually(t, "the same repository's pull request claimed", func() bool {
					st, err = e.log.Get(t.Context(), 62)
					return err == nil
				})
				assert.False(t, st.Fork, "a pull request from the repository itself recorded as a fork's")
			}
		})
	}
}

func TestSchedulerFailsClaimsNotPickedUp(t *testing.T) {
	e := newEnv(t)
	clk := &clock{now: time.Now()}
	e.runScheduler(clk)
	e.forge.Push(taskWithRunsOn(31, "[self-hosted, pod]"))
	eventually(t, "the claim", func() bool { _, err := e.log.Get(t.Context(), 31); return err == nil })
	// Past the pickup deadline (2 min) and the restart grace (2/3 of the 5 min lease).
	clk.Advance(3*time.Minute + 30*time.Second)
	eventually(t, "the upstream failure", func() bool { return e.forge.Result(31) == runnerv1.Result_RESULT_FAILURE })
	eventually(t, "the closed record", func() bool {
		st, err := e.log.Get(t.Context(), 31)
		return err == nil && st.Phase == assignment.Closed
	})
	assert.Contains(t, strings.Join(e.forge.Log(31), "\n"), "PICKUP_SECS", "the log does not explain the pickup timeout")
	eventually(t, "the sealed task dropped", func() bool {
		_, err := e.log.GetTask(t.Context(), 31)
		return errors.Is(err, assignment.ErrNotFound)
	})
}

func TestSchedulerKeepsStartingTasksAliveAndSeesCancellation(t *testing.T) {
	e := newEnv(t)
	clk := &clock{now: time.Now()}
	e.runScheduler(clk)
	e.forge.Push(taskWithRunsOn(41, "[self-hosted, pod]"))
	eventually(t, "a keepalive", func() bool { return e.forge.Reports(41) > 0 })
	e.forge.Cancel(41)
	clk.Advance(time.Minute + time.Second)
	eventually(t, "the cancellation", func() bool {
		st, err := e.log.Get(t.Context(), 41)
		return err == nil && st.Phase == assignment.Closed && strings.Contains(st.Reason, "cancelled")
	})
}

// TestSchedulerFetchesOnlyWithCapacity: with the pod tier full, no task is taken from the
// forge; once an assignment ends, the next one is, without waiting for a new tasks version.
func TestSchedulerFetchesOnlyWithCapacity(t *testing.T) {
	e := newEnv(t)
	e.runSchedulerWith(&clock{now: time.Now()}, map[assignment.Backend]int{assignment.BackendPod: 1})
	e.forge.Push(taskWithRunsOn(51, "[self-hosted, pod]"))
	e.forge.Push(taskWithRunsOn(52, "[self-hosted, pod]"))
	eventually(t, "the first claim", func() bool { _, err := e.log.Get(t.Context(), 51); return err == nil })
	before := e.forge.Fetches()
	// Several fetch intervals pass (bounded polling on the fake forge's counter is not
	// possible while nothing is fetched, so observe the claim of 52 not happening meanwhile).
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		_, err := e.log.Get(t.Context(), 52)
		require.Error(t, err, "a second task was claimed while the only pod slot was taken")
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, before, e.forge.Fetches(), "fetches while full, want none")
	st, _ := e.log.Get(t.Context(), 51)
	_, err := e.log.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: 51, Epoch: st.Epoch(), At: time.Now(), Reason: "test"}, nil)
	require.NoError(t, err)
	eventually(t, "the second claim", func() bool { _, err := e.log.Get(t.Context(), 52); return err == nil })
}

// TestSchedulerIsReadyWhileATierIsFull: a scheduler that starts (a rolling restart) while
// every slot of a busy fleet's tier is taken does not fetch; it is ready all the same, instead of
// holding the restart until a slot frees.
func TestSchedulerIsReadyWhileATierIsFull(t *testing.T) {
	e := newEnv(t)
	_, err := e.log.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: 61, Actor: "scheduler-before", At: time.Now(),
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	require.NoError(t, err)
	eventually(t, "the view to show the claim", func() bool { _, ok := e.view.Get(61); return ok })
	s := e.runSchedulerAdmission(&clock{now: time.Now()}, map[assignment.Backend]int{assignment.BackendPod: 1}, nil, scheduler.Admission{})
	select {
	case <-s.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("a scheduler of a full fleet is not ready")
	}
	require.Zero(t, e.forge.Fetches(), "fetched while the tier was full")
}

// TestSchedulerIsNotWedgedByForgedRecords: someone with the NATS password appends a malformed
// record and a forged `failed` with its own text to a claimed assignment. Neither is believed:
// the forge's log gets none of the attacker's text, the assignment ends by its real deadline,
// and its sealed task is dropped.
func TestSchedulerIsNotWedgedByForgedRecords(t *testing.T) {
	e := newEnv(t)
	clk := &clock{now: time.Now()}
	e.runScheduler(clk)
	e.forge.Push(taskWithRunsOn(31, "[self-hosted, pod]"))
	var st assignment.State
	eventually(t, "the claim", func() bool {
		var err error
		st, err = e.log.Get(t.Context(), 31)
		return err == nil
	})
	js := e.js
	_, err := js.Publish(t.Context(), eventlog.RecordSubject(31, assignment.Renewed), []byte(`{"transition":"renewed","task_id":"31"`))
	require.NoError(t, err)
	forged := st.Record
	forged.Transition, forged.Phase, forged.Reason = assignment.Failed, assignment.Failed, "ATTACKER TEXT"
	data, err := json.Marshal(forged)
	require.NoError(t, err)
	_, err = js.Publish(t.Context(), eventlog.RecordSubject(31, assignment.Failed), data)
	require.NoError(t, err)

	clk.Advance(3*time.Minute + 30*time.Second)
	eventually(t, "the closed record", func() bool {
		st, err := e.log.Get(t.Context(), 31)
		return err == nil && st.Phase == assignment.Closed
	})
	log := strings.Join(e.forge.Log(31), "\n")
	assert.Contains(t, log, "PICKUP_SECS")
	assert.NotContains(t, log, "ATTACKER TEXT")
	eventually(t, "the sealed task dropped", func() bool {
		_, err := e.log.GetTask(t.Context(), 31)
		return errors.Is(err, assignment.ErrNotFound)
	})
}

// TestSchedulerSweepsWhatEndedAssignmentsLeft: an assignment ended but its key in the live
// index was put again by an append that raced the end (or its removal was lost), and its
// sealed task outlived the view's memory of it. The scheduler's sweep removes both.
func TestSchedulerSweepsWhatEndedAssignmentsLeft(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	<-e.view.Ready()
	st, err := e.log.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: 21, Actor: "test", At: time.Now(),
		Backend: assignment.BackendPod, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	require.NoError(t, err)
	for _, tr := range []assignment.Transition{assignment.Failed, assignment.Closed} {
		st, err = e.log.Apply(ctx, assignment.Event{Transition: tr, Task: 21, Epoch: st.Epoch(), Actor: "test", At: time.Now(), Reason: "x"}, &st)
		require.NoError(t, err)
	}
	eventually(t, "the view sees the end", func() bool { s, ok := e.view.Get(21); return ok && s.Phase == assignment.Closed })
	e.view.Forget(time.Now().Add(time.Hour)) // the view no longer knows it
	_, err = e.log.Live().Put(ctx, "task.21", []byte("1"))
	require.NoError(t, err)
	require.NoError(t, e.log.PutTask(ctx, 21, []byte("sealed")))

	e.runScheduler(&clock{now: time.Now()})
	eventually(t, "the sweep", func() bool {
		_, kerr := e.log.Live().Get(ctx, "task.21")
		_, terr := e.log.GetTask(ctx, 21)
		return errors.Is(kerr, jetstream.ErrKeyNotFound) && errors.Is(terr, assignment.ErrNotFound)
	})
}

// TestSchedulerQueuesClaimsAndAdmitsWhenCapacityFrees: with an admission queue, claims past the
// tier's capacity wait in phase queued (no dispatch), the scheduler stops fetching once
// MAX_QUEUED wait, capacity that frees admits the oldest, and a claim that waits past
// QUEUE_SECS fails upstream saying the fleet was full.
func TestSchedulerQueuesClaimsAndAdmitsWhenCapacityFrees(t *testing.T) {
	e := newEnv(t)
	clk := &clock{now: time.Now()}
	e.runSchedulerAdmission(clk, map[assignment.Backend]int{assignment.BackendPod: 1}, nil,
		scheduler.Admission{MaxQueued: 2, Queue: 10 * time.Minute})
	for id := int64(61); id <= 64; id++ {
		e.forge.Push(taskWithRunsOn(id, "[self-hosted, pod]"))
	}
	phase := func(id assignment.TaskID) assignment.Phase {
		st, err := e.log.Get(t.Context(), id)
		if err != nil {
			return ""
		}
		return st.Phase
	}
	eventually(t, "one claim and two queued", func() bool {
		return phase(61) == assignment.Claimed && phase(62) == assignment.Queued && phase(63) == assignment.Queued
	})
	before := e.forge.Fetches()
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		require.Empty(t, phase(64), "a task was claimed while MAX_QUEUED claims waited")
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, before, e.forge.Fetches(), "fetches while the queue was full, want none")
	cons, err := e.log.Consumer(t.Context(), assignment.BackendPod)
	require.NoError(t, err)
	msg, err := cons.Next()
	require.NoError(t, err)
	require.Contains(t, string(msg.Data()), `"task_id":61`, "the first dispatch is not the claim that had capacity")
	require.NoError(t, msg.Ack())

	st, err := e.log.Get(t.Context(), 61)
	require.NoError(t, err)
	_, err = e.log.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: 61, Epoch: st.Epoch(), At: clk.Now(), Reason: "test"}, nil)
	require.NoError(t, err)
	eventually(t, "the oldest queued claim admitted and the next task claimed into the queue", func() bool {
		return phase(62) == assignment.Claimed && phase(63) == assignment.Queued && phase(64) == assignment.Queued
	})
	admitted, err := e.log.Get(t.Context(), 62)
	require.NoError(t, err)
	require.Equal(t, assignment.Admitted, admitted.Transition)
	require.Equal(t, admitted.AdmittedAt.Add(2*time.Minute), admitted.PickupDeadline, "the pickup deadline does not count from admission")
	msg, err = cons.Next()
	require.NoError(t, err)
	require.Contains(t, string(msg.Data()), `"task_id":62`, "the admitted claim was not dispatched")
	require.NoError(t, msg.Ack())
	require.Zero(t, e.forge.Result(63), "a queued task was reported")

	// Past QUEUE_SECS (and the restart grace): the queued claims fail upstream, saying why.
	clk.Advance(11 * time.Minute)
	for _, id := range []int64{63, 64} {
		eventually(t, "the queued task failed upstream", func() bool { return e.forge.Result(id) == runnerv1.Result_RESULT_FAILURE })
		assert.Contains(t, strings.Join(e.forge.Log(id), "\n"), "the fleet was full", "task %d", id)
		assert.Contains(t, strings.Join(e.forge.Log(id), "\n"), "QUEUE_SECS", "task %d", id)
	}
}

// taskOf returns a pod task of repository repo.
func taskOf(id int64, repo string) *runnerv1.Task {
	t := taskWithRunsOn(id, "[self-hosted, pod]")
	t.Context.Fields["repository"] = structpb.NewStringValue(repo)
	return t
}

// TestSchedulerAdmitsFairlyAcrossOwners: capacity 1; owner a's three claims queue before owner
// b's one; with FAIRNESS=owner b's claim is admitted at the next free slot, ahead of a's older
// ones, and FAIR_SHARE_CAP=1 keeps a at one environment even with two slots free.
func TestSchedulerAdmitsFairlyAcrossOwners(t *testing.T) {
	e := newEnv(t)
	clk := &clock{now: time.Now()}
	capacity := map[assignment.Backend]int{assignment.BackendPod: 2}
	e.runSchedulerAdmission(clk, capacity, nil,
		scheduler.Admission{MaxQueued: 10, Queue: 10 * time.Minute, Fairness: scheduler.FairnessOwner, ShareCap: 1})
	for id := int64(71); id <= 73; id++ {
		e.forge.Push(taskOf(id, "a/app"))
	}
	phase := func(id assignment.TaskID) assignment.Phase {
		st, err := e.log.Get(t.Context(), id)
		if err != nil {
			return ""
		}
		return st.Phase
	}
	eventually(t, "a's first in flight, the others queued by the share cap", func() bool {
		return phase(71) == assignment.Claimed && phase(72) == assignment.Queued && phase(73) == assignment.Queued
	})
	e.forge.Push(taskOf(74, "b/lib"))
	eventually(t, "b's claim admitted into the free slot ahead of a's older claims", func() bool {
		return phase(74) == assignment.Claimed
	})
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		require.Equal(t, assignment.Queued, phase(72), "owner a got a second environment past FAIR_SHARE_CAP=1")
		time.Sleep(20 * time.Millisecond)
	}
	st, err := e.log.Get(t.Context(), 71)
	require.NoError(t, err)
	_, err = e.log.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: 71, Epoch: st.Epoch(), At: clk.Now(), Reason: "test"}, nil)
	require.NoError(t, err)
	eventually(t, "a's oldest queued claim admitted once its environment ended", func() bool { return phase(72) == assignment.Claimed })
	require.Equal(t, assignment.Queued, phase(73))
}
