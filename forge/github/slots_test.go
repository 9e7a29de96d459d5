package github_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github"
	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/forge/github/githubtest/standin"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
)

var slotBox = func() *sealbox.Box {
	b, err := sealbox.New([]byte("fedcba9876543210fedcba9876543210"))
	if err != nil {
		panic(err)
	}
	return b
}()

// slotBed is a bed whose pod scale set's session is served by Slots.
type slotBed struct {
	*bed
	pod   github.ScaleSet
	slots *github.Slots
	sess  *github.Session
}

func newSlotBed(t *testing.T, capacity int, mods ...func(*bed, *github.SlotsConfig)) *slotBed {
	t.Helper()
	b := newBed(t, func(o *githubtest.Options) { o.AssignOnAcquire = true })
	sets, err := github.EnsureScaleSets(t.Context(), b.clients.Client(), tiers)
	require.NoError(t, err)
	cfg := github.SlotsConfig{
		Events: b.log, View: b.view, Box: slotBox, Actor: "scheduler@test",
		Capacity: func(assignment.Backend) int { return capacity }, Pickup: 10 * time.Minute, Metrics: b.metrics, Log: zerolog.Nop(),
	}
	for _, m := range mods {
		m(b, &cfg)
	}
	slots := github.NewSlots(cfg)
	return &slotBed{bed: b, pod: sets[0], slots: slots, sess: b.session(sets[0], "scheduler@test", slots)}
}

// slots are the live GitHub slots of the pod scale set, from the view.
func (b *slotBed) live() []assignment.State {
	var out []assignment.State
	for _, st := range b.view.Live() {
		if st.GitHub() && st.ScaleSet == b.pod.ID {
			out = append(out, st)
		}
	}
	return out
}

func (b *slotBed) state(t *testing.T, id assignment.TaskID) assignment.State {
	t.Helper()
	st, err := b.log.Get(t.Context(), id)
	require.NoError(t, err)
	return st
}

// waitConfigured waits until n live slots are configured with a runner.
func (b *slotBed) waitConfigured(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		ready := 0
		for _, st := range b.live() {
			if st.Ready() {
				ready++
			}
		}
		return ready == n
	}, 15*time.Second, 20*time.Millisecond, "%d jobs did not get %d configured slots", n, n)
}

// busyAndIdle makes two configured slots for two queued jobs, then stops the session and starts
// the first job on the first slot's runner at GitHub without telling the session: the busy
// slot's runner is running a job its messages have not told of, the idle one's none.
func (b *slotBed) busyAndIdle(t *testing.T) (busy, idle assignment.State) {
	t.Helper()
	stop := run(t, b.sess)
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	_, err = b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	b.waitConfigured(t, 2)
	stop()
	slots := b.live()
	busy, idle = slots[0], slots[1]
	_, err = b.srv.StartJob(job, int(busy.RunnerID))
	require.NoError(t, err)
	return busy, idle
}

// dispatched drains the pod dispatch queue and returns the tasks it named.
func (b *slotBed) dispatched(t *testing.T) []assignment.TaskID {
	t.Helper()
	c, err := b.log.Consumer(t.Context(), assignment.BackendPod)
	require.NoError(t, err)
	var out []assignment.TaskID
	for {
		msgs, err := c.FetchNoWait(10)
		require.NoError(t, err)
		n := 0
		for m := range msgs.Messages() {
			d, err := b.log.ParseDispatch(m)
			require.NoError(t, err)
			out = append(out, d.Task)
			require.NoError(t, m.Ack())
			n++
		}
		if n == 0 {
			return out
		}
	}
}

// TestSlotsFollowTheJobs: jobs queued for the pod scale set each get a slot, persisted and
// configured with a JIT runner of its own and dispatched; a job started on a slot's runner is
// recorded on that slot, its completion ends the slot and its runner.
func TestSlotsFollowTheJobs(t *testing.T) {
	b := newSlotBed(t, 4)
	run(t, b.sess)
	job1, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Repository: "app", DisplayName: "build"})
	require.NoError(t, err)
	job2, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)

	b.waitConfigured(t, 2)
	slots := b.live()
	runners := map[int64]string{}
	for _, r := range b.srv.Runners() {
		runners[int64(r.ID)] = r.Name
	}
	require.Len(t, runners, 2, "GitHub has another number of runners than slots")
	for _, st := range slots {
		assert.Equal(t, assignment.Claimed, st.Phase)
		assert.Equal(t, assignment.BackendPod, st.Backend)
		assert.Equal(t, st.RunnerName, runners[st.RunnerID], "slot %d's runner id names another runner", st.Task)
		sealed, err := b.log.GetTask(t.Context(), st.Task)
		require.NoError(t, err)
		jit, err := sealedtask.OpenJIT(slotBox, st.Task, sealed, st.TaskDigest)
		require.NoError(t, err)
		cfg, err := standin.DecodeJITConfig(jit)
		require.NoError(t, err)
		assert.EqualValues(t, st.RunnerID, cfg.AgentID, "the sealed configuration is another runner's")
	}
	assert.ElementsMatch(t, []assignment.TaskID{slots[0].Task, slots[1].Task}, b.dispatched(t), "the slots were not dispatched once each")

	// GitHub gives job 1 to the second slot's runner: that slot records it.
	_, err = b.srv.StartJob(job1, int(slots[1].RunnerID))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.state(t, slots[1].Task).Phase == assignment.Running }, 10*time.Second, 20*time.Millisecond,
		"JobStarted was not recorded on the slot whose runner took the job")
	st := b.state(t, slots[1].Task)
	assert.Equal(t, "octo/app", st.Repo)
	assert.Equal(t, "build", st.Job)
	assert.NotEmpty(t, st.GitHubJob)
	assert.Equal(t, assignment.Claimed, b.state(t, slots[0].Task).Phase, "the other slot was bound too")

	require.NoError(t, b.srv.CompleteJob(job1, "succeeded"))
	require.Eventually(t, func() bool { return b.state(t, slots[1].Task).Phase == assignment.Completed }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, "succeeded", b.state(t, slots[1].Task).Result)
	for _, r := range b.srv.Runners() {
		assert.NotEqual(t, slots[1].RunnerID, int64(r.ID), "the completed slot's runner is still registered")
	}
	// Job 2 is still assigned: its slot stays, and no third one is made.
	require.Eventually(t, func() bool { return len(b.live()) == 1 }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, slots[0].Task, b.live()[0].Task)
	j, err := b.srv.Job(job2)
	require.NoError(t, err)
	assert.Equal(t, githubtest.JobAssigned, j.State)
}

// TestSlotsStayWithinCapacity: with capacity 2 and 5 jobs, never more than 2 active slots.
func TestSlotsStayWithinCapacity(t *testing.T) {
	b := newSlotBed(t, 2)
	run(t, b.sess)
	for range 5 {
		_, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
		require.NoError(t, err)
	}
	deadline := time.Now().Add(3 * time.Second)
	most := 0
	for time.Now().Before(deadline) {
		most = max(most, len(b.live()))
		time.Sleep(10 * time.Millisecond)
	}
	assert.Equal(t, 2, most, "active slots beyond capacity, or fewer than it")
	assert.Len(t, b.srv.Runners(), 2, "GitHub has runners beyond capacity")
}

// TestSlotsRecoverAHolderThatDied: a holder that died at each step between the claim and the
// dispatch leaves a record the next one finishes from, with exactly one runner per slot.
func TestSlotsRecoverAHolderThatDied(t *testing.T) {
	b := newSlotBed(t, 4)
	ctx := t.Context()
	client := b.clients.Client()
	claim := func(n int64) assignment.State {
		id := assignment.SlotBase + assignment.TaskID(n)
		st, err := b.log.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: id, Backend: assignment.BackendPod,
			Actor: "scheduler@dead", At: time.Now(), Forge: assignment.ForgeGitHub, ScaleSet: b.pod.ID,
			RunnerName: fmt.Sprintf("%s-%d", b.pod.Name, n), Lease: time.Hour, Pickup: 10 * time.Minute}, nil)
		require.NoError(t, err)
		return st
	}
	// Died after the claim, before GitHub was called.
	intent := claim(1)
	// Died after GitHub made the runner, before its configuration was stored: it is lost.
	lost := claim(2)
	orphan, err := client.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: lost.RunnerName}, b.pod.ID)
	require.NoError(t, err)
	// Died after storing the configuration, before `configured`.
	stored := claim(3)
	kept, err := client.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: stored.RunnerName}, b.pod.ID)
	require.NoError(t, err)
	sealed, _, err := sealedtask.SealJIT(slotBox, stored.Task, kept.EncodedJITConfig)
	require.NoError(t, err)
	require.NoError(t, b.log.PutTask(ctx, stored.Task, sealed))

	require.Eventually(t, func() bool { return len(b.view.Live()) == 3 }, 5*time.Second, 10*time.Millisecond)
	run(t, b.sess)
	require.Eventually(t, func() bool {
		for _, st := range b.live() {
			if !st.Ready() {
				return false
			}
		}
		return true
	}, 15*time.Second, 20*time.Millisecond, "the next holder did not configure the slots left half done")

	byName := map[string][]int{}
	for _, r := range b.srv.Runners() {
		byName[r.Name] = append(byName[r.Name], r.ID)
	}
	require.Len(t, byName, 3, "runners: %v", byName)
	for _, st := range []assignment.State{intent, lost, stored} {
		got := b.state(t, st.Task)
		require.Len(t, byName[st.RunnerName], 1, "slot %d has another number of runners than one", st.Task)
		assert.EqualValues(t, byName[st.RunnerName][0], got.RunnerID, "slot %d recorded another runner", st.Task)
	}
	assert.NotEqual(t, int64(orphan.Runner.ID), b.state(t, lost.Task).RunnerID, "the runner whose configuration was lost was kept")
	assert.EqualValues(t, kept.Runner.ID, b.state(t, stored.Task).RunnerID, "a stored configuration whose runner exists was not taken")
	assert.ElementsMatch(t, []assignment.TaskID{intent.Task, lost.Task, stored.Task}, b.dispatched(t))
}

// TestSlotsCloseFailedSlots: a failed slot (its runner got no job by the pickup deadline, or
// its environment was lost) has its runner removed by id and is closed.
func TestSlotsCloseFailedSlots(t *testing.T) {
	b := newSlotBed(t, 4)
	run(t, b.sess)
	_, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(b.live()) == 1 && b.live()[0].Ready() }, 15*time.Second, 20*time.Millisecond)
	st := b.live()[0]
	_, err = b.log.Apply(t.Context(), assignment.Event{Transition: assignment.Failed, Task: st.Task, Epoch: st.Epoch(),
		Actor: "scheduler@test", At: time.Now(), Reason: "lost"}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.state(t, st.Task).Phase == assignment.Closed }, 15*time.Second, 20*time.Millisecond,
		"the failed slot was not closed")
	for _, r := range b.srv.Runners() {
		assert.NotEqual(t, st.RunnerID, int64(r.ID), "the failed slot's runner is still registered")
	}
}

// TestSlotsIgnoreForeignRunners: a JobStarted for a runner that is no slot's (another
// controller's runner in the same scale set) changes nothing, and the message is acknowledged.
func TestSlotsIgnoreForeignRunners(t *testing.T) {
	b := newSlotBed(t, 0) // no capacity: no slot of its own either
	foreign, err := b.clients.Client().GenerateJitRunnerConfig(t.Context(), &scaleset.RunnerScaleSetJitRunnerSetting{Name: "someone-else"}, b.pod.ID)
	require.NoError(t, err)
	run(t, b.sess)
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { j, _ := b.srv.Job(job); return j.State == githubtest.JobAssigned }, 10*time.Second, 20*time.Millisecond)
	_, err = b.srv.StartJob(job, foreign.Runner.ID)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.srv.PendingMessages(b.pod.ID) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the message about another runner was not acknowledged")
	assert.Empty(t, b.view.Live(), "a foreign runner's job made or changed a slot")
}

// TestMalformedMessagesAreDropped: messages the client cannot parse (a body that is not a JSON
// array, a type it does not know) are acknowledged unhandled and counted, and change nothing;
// the job queued after them is served.
func TestMalformedMessagesAreDropped(t *testing.T) {
	b := newSlotBed(t, 4)
	_, err := b.srv.QueueRawMessage(b.pod.ID, "RunnerScaleSetJobMessages", `{"not": "an array"`)
	require.NoError(t, err)
	_, err = b.srv.QueueRawMessage(b.pod.ID, "SomethingNew", `[]`)
	require.NoError(t, err)
	run(t, b.sess)
	_, err = b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(b.live()) == 1 && b.live()[0].Ready() }, 15*time.Second, 20*time.Millisecond,
		"the job queued after the malformed messages was not served")
	assert.Equal(t, 2.0, testutil.ToFloat64(b.metrics.Dropped.WithLabelValues(itoa(b.pod.ID))))
	require.Eventually(t, func() bool { return b.srv.PendingMessages(b.pod.ID) == 0 }, 10*time.Second, 20*time.Millisecond)
}

// TestSlotsKeepARunnerThatTookAJob: statistics that no longer count a slot whose runner has
// just taken a job (its JobStarted comes in a later message) retire the idle slot but not that
// one: GitHub refuses to remove a busy runner, and the slot is kept until its JobStarted.
func TestSlotsKeepARunnerThatTookAJob(t *testing.T) {
	b := newSlotBed(t, 4)
	busy, idle := b.busyAndIdle(t)

	// A message whose statistics count no assigned job, and that does not tell of the start.
	require.NoError(t, b.slots.Handle(t.Context(), b.sess, &scaleset.RunnerScaleSetMessage{Statistics: &scaleset.RunnerScaleSetStatistic{}}))
	assert.True(t, b.state(t, busy.Task).Active(), "the slot whose runner is running a job was retired")
	assert.False(t, b.state(t, idle.Task).Active(), "the idle slot was not retired")
	var ids []int64
	for _, r := range b.srv.Runners() {
		ids = append(ids, int64(r.ID))
	}
	assert.Equal(t, []int64{busy.RunnerID}, ids, "GitHub's runners are not the busy slot's alone")

	run(t, b.sess)
	require.Eventually(t, func() bool { return b.state(t, busy.Task).Phase == assignment.Running }, 10*time.Second, 20*time.Millisecond,
		"the kept slot did not record its JobStarted")
}

// TestSlotsRetireIdleRunnersBeforeTheirDeadline: a slot whose runner got no job is retired
// ahead of its idle deadline (GITHUB_IDLE_SECS), its runner removed at GitHub before the slot
// fails; a runner that has just taken a job (busy at GitHub, its JobStarted not yet told)
// keeps its slot, where the deadline itself would have failed it.
func TestSlotsRetireIdleRunnersBeforeTheirDeadline(t *testing.T) {
	var skew atomic.Int64
	b := newSlotBed(t, 4, func(_ *bed, c *github.SlotsConfig) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	})
	busy, idle := b.busyAndIdle(t)

	skew.Store(int64(8*time.Minute + 50*time.Second))
	require.NoError(t, b.slots.Reconcile(t.Context(), b.sess))
	require.True(t, b.state(t, idle.Task).Active(), "a slot was retired more than a minute before its idle deadline")

	// 9.5 of the ten minutes of Pickup passed: within a minute of the deadline, not past it.
	skew.Store(int64(9*time.Minute + 30*time.Second))
	require.NoError(t, b.slots.Reconcile(t.Context(), b.sess))
	assert.True(t, b.state(t, busy.Task).Active(), "the slot whose runner is running a job was retired")
	got := b.state(t, idle.Task)
	assert.False(t, got.Active(), "the idle slot was not retired before its deadline")
	assert.Contains(t, got.Reason, "GITHUB_IDLE_SECS")
	assert.False(t, got.Lost, "an idle slot lost no job")
	var ids []int64
	for _, r := range b.srv.Runners() {
		ids = append(ids, int64(r.ID))
	}
	assert.Equal(t, []int64{busy.RunnerID}, ids, "GitHub's runners are not the busy slot's alone")
}
