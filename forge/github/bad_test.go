package github_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github"
	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Bad messages: what GitHub should never send, or what reaches the controller garbled. Each
// gets a clear log, is acknowledged or refused, and changes nothing it should not.

func TestFits(t *testing.T) {
	pod := github.ScaleSet{Tier: assignment.BackendPod, ID: 1, Name: "dynrunner-pod"}
	for _, tc := range []struct {
		name   string
		labels []string
		want   bool
	}{
		{"the tier's labels", []string{"self-hosted", "pod"}, true},
		{"in another order and case", []string{"POD", "Self-Hosted"}, true},
		{"the tier alone", []string{"pod"}, true},
		{"self-hosted alone", []string{"self-hosted"}, true},
		{"the scale set's name", []string{"dynrunner-pod"}, true},
		{"no labels", nil, false},
		{"another tier", []string{"self-hosted", "vm"}, false},
		{"both tiers", []string{"self-hosted", "pod", "vm"}, false},
		{"a label the scale set does not have", []string{"self-hosted", "pod", "gpu"}, false},
		{"another scale set's name", []string{"dynrunner-vm"}, false},
		{"GitHub's hosted runners", []string{"ubuntu-latest"}, false},
		{"an empty label", []string{"self-hosted", ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, github.Fits(tc.labels, pod))
		})
	}
}

// TestJobsOfOtherLabelsAreRefused: someone added a label to the pod scale set in GitHub, so
// GitHub sends it jobs for labels dynrunner does not serve there. They are refused, logged and
// counted: not acquired, and one GitHub assigned to the scale set anyway (as github.com does
// without waiting for the acquisition) makes no slot. The job of the scale set's own labels
// queued beside them gets its slot.
func TestJobsOfOtherLabelsAreRefused(t *testing.T) {
	b := newSlotBed(t, 4)
	ctx := t.Context()
	c := b.clients.Client()
	set, err := c.GetRunnerScaleSetByID(ctx, b.pod.ID)
	require.NoError(t, err)
	set.Labels = append(set.Labels, scaleset.Label{Type: "System", Name: "gpu"}, scaleset.Label{Type: "System", Name: "vm"})
	_, err = c.UpdateRunnerScaleSet(ctx, set.ID, set)
	require.NoError(t, err)

	var foreign []int64
	for _, labels := range [][]string{{"self-hosted", "gpu"}, {"self-hosted", "pod", "gpu"}, {"self-hosted", "pod", "vm"}} {
		id, err := b.srv.QueueJob(githubtest.JobSpec{Labels: labels})
		require.NoError(t, err)
		j, err := b.srv.Job(id)
		require.NoError(t, err)
		require.Equal(t, b.pod.ID, j.ScaleSetID, "the fake sent a %v job elsewhere", labels)
		foreign = append(foreign, id)
	}
	assigned, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "gpu"}})
	require.NoError(t, err)
	require.NoError(t, b.srv.AssignJob(assigned))
	own, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)

	run(t, b.sess)
	require.Eventually(t, func() bool {
		j, _ := b.srv.Job(own)
		return j.State == githubtest.JobAssigned && b.srv.PendingMessages(b.pod.ID) == 0 && len(b.live()) > 0 && b.live()[0].Ready()
	}, 15*time.Second, 20*time.Millisecond, "the job of the scale set's labels was not served")
	assert.Len(t, b.live(), 1, "a refused job got a slot")
	assert.Len(t, b.srv.Runners(), 1, "a refused job got a runner")
	for _, id := range foreign {
		j, err := b.srv.Job(id)
		require.NoError(t, err)
		assert.Equal(t, githubtest.JobQueued, j.State, "job %d of labels %v was acquired", id, j.Labels)
	}
	assert.Equal(t, 4.0, testutil.ToFloat64(b.metrics.JobsRefused.WithLabelValues(itoa(b.pod.ID))), "each refused job is counted once")

	// The assigned refused job completes (cancelled): it is forgotten, and a new job of the
	// scale set's labels gets a slot of its own, not one too many or too few.
	require.NoError(t, b.srv.CompleteJob(assigned, "canceled"))
	_, err = b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(b.live()) == 2 && b.srv.PendingMessages(b.pod.ID) == 0 }, 15*time.Second, 20*time.Millisecond)
	assert.Len(t, b.live(), 2)
}

// TestMessageWithoutStatisticsScalesNothing: a message without statistics says nothing of how
// many jobs are assigned: it retires no idle slot (its job is still assigned) and makes none.
func TestMessageWithoutStatisticsScalesNothing(t *testing.T) {
	b := newSlotBed(t, 4)
	run(t, b.sess)
	_, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return len(b.live()) == 1 && b.live()[0].Ready() && b.srv.PendingMessages(b.pod.ID) == 0
	}, 15*time.Second, 20*time.Millisecond)
	slot := b.live()[0]

	_, err = b.srv.QueueMessageWithoutStatistics(b.pod.ID)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.srv.PendingMessages(b.pod.ID) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the message without statistics was not acknowledged")
	st := b.state(t, slot.Task)
	assert.True(t, st.Active(), "a message without statistics retired the idle slot of an assigned job: %s %s", st.Phase, st.Reason)
	assert.Len(t, b.live(), 1, "a message without statistics made a slot")
	assert.Len(t, b.srv.Runners(), 1)
}

// garbled is an answer of the message queue cut short on its way (a proxy, a reset): the
// client cannot parse it.
const garbled = `{"messageId": 1, "messageType": "RunnerScaleSetJobMessages", "body": "[{\"messageType\": \"JobAvail`

// TestGarbledAnswerDropsNoMessage: an answer of the queue the client cannot parse is read
// again; the message it was of, well-formed, is handled and not dropped. A message whose batch
// holds one job message that cannot be parsed has the others handled; only that one is
// dropped, logged and counted.
func TestGarbledAnswerDropsNoMessage(t *testing.T) {
	b := newSlotBed(t, 4)
	job1, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	b.srv.InjectFault(githubtest.OpGetMessage, githubtest.Fault{Status: 200, Body: garbled})
	run(t, b.sess)
	require.Eventually(t, func() bool { return len(b.live()) == 1 && b.live()[0].Ready() }, 15*time.Second, 20*time.Millisecond,
		"the job whose message came garbled once was not served")
	j, err := b.srv.Job(job1)
	require.NoError(t, err)
	assert.Equal(t, githubtest.JobAssigned, j.State)
	assert.Zero(t, testutil.ToFloat64(b.metrics.Dropped.WithLabelValues(itoa(b.pod.ID))), "a message was dropped for a garbled answer")

	// A batch of a good JobStarted and a JobCompleted that cannot be parsed.
	require.Eventually(t, func() bool { return b.srv.PendingMessages(b.pod.ID) == 0 }, 10*time.Second, 20*time.Millisecond)
	slot := b.live()[0]
	batch := fmt.Sprintf(`[{"messageType": "JobStarted", "runnerRequestId": %d, "jobId": "job-one", "ownerName": "octo", "repositoryName": "app",
		"workflowRunId": 77, "runnerId": %d, "runnerName": %q},
		{"messageType": "JobCompleted", "runnerRequestId": %d, "jobId": "job-one", "runnerId": "not a number", "result": "failed"}]`,
		job1, slot.RunnerID, slot.RunnerName, job1)
	_, err = b.srv.QueueRawMessage(b.pod.ID, "RunnerScaleSetJobMessages", batch)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.srv.PendingMessages(b.pod.ID) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the message with a garbled job message was not acknowledged")
	st := b.state(t, slot.Task)
	assert.Equal(t, assignment.Running, st.Phase, "the good JobStarted beside a garbled JobCompleted was dropped")
	assert.Equal(t, "job-one", st.GitHubJob)
	assert.Equal(t, "octo/app", st.Repo)
	assert.Equal(t, 1.0, testutil.ToFloat64(b.metrics.Dropped.WithLabelValues(itoa(b.pod.ID))), "the garbled job message was not counted")
}

// TestJobMessagesForNoSlotChangeNothing: job messages that name no slot's runner, a runner by
// one slot's id and another's name, or a job that is not the one a slot's runner took change
// nothing and are acknowledged; GitHub's own completion afterwards is recorded.
func TestJobMessagesForNoSlotChangeNothing(t *testing.T) {
	b := newSlotBed(t, 4)
	run(t, b.sess)
	job1, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	_, err = b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		l := b.live()
		return len(l) == 2 && l[0].Ready() && l[1].Ready()
	}, 15*time.Second, 20*time.Millisecond)
	slots := b.live()
	busy, idle := slots[0], slots[1]
	_, err = b.srv.StartJob(job1, int(busy.RunnerID))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.state(t, busy.Task).Phase == assignment.Running }, 10*time.Second, 20*time.Millisecond)
	busyJob := b.state(t, busy.Task).GitHubJob
	require.NotEmpty(t, busyJob)

	msg := func(typ string, runnerID int64, name, jobID string) string {
		return fmt.Sprintf(`{"messageType": %q, "runnerRequestId": 999, "jobId": %q, "ownerName": "octo", "repositoryName": "evil",
			"workflowRunId": 666, "runnerId": %d, "runnerName": %q, "result": "failed"}`, typ, jobID, runnerID, name)
	}
	for _, m := range []string{
		msg("JobStarted", 9999, "nobody", "x1"),                      // no slot's runner
		msg("JobStarted", idle.RunnerID, busy.RunnerName, "x2"),      // one slot's id, the other's name
		msg("JobStarted", busy.RunnerID, idle.RunnerName, "x3"),      // the other way round
		msg("JobCompleted", busy.RunnerID, busy.RunnerName, "x4"),    // the busy slot's runner, another job
		msg("JobCompleted", 0, busy.RunnerName, "x5"),                // by name only, another job
		msg("JobCompleted", idle.RunnerID, busy.RunnerName, busyJob), // one slot's id, the other's name
		msg("JobCompleted", 9999, "nobody", busyJob),                 // no slot's runner
	} {
		_, err := b.srv.QueueRawMessage(b.pod.ID, "RunnerScaleSetJobMessages", "["+m+"]")
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return b.srv.PendingMessages(b.pod.ID) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the messages naming no slot were not acknowledged")
	got := b.state(t, busy.Task)
	assert.Equal(t, assignment.Running, got.Phase, "a message about another job ended the busy slot: %s", got.Result)
	assert.Equal(t, busyJob, got.GitHubJob)
	got = b.state(t, idle.Task)
	assert.True(t, got.Active(), "the idle slot ended: %s", got.Phase)
	assert.Empty(t, got.GitHubJob, "the idle slot was bound to a job its runner did not take")
	assert.Len(t, b.srv.Runners(), 2, "a message naming no slot removed a runner")
	assert.Zero(t, testutil.ToFloat64(b.metrics.Dropped.WithLabelValues(itoa(b.pod.ID))))

	require.NoError(t, b.srv.CompleteJob(job1, "succeeded"))
	require.Eventually(t, func() bool { return b.state(t, busy.Task).Phase == assignment.Completed }, 10*time.Second, 20*time.Millisecond,
		"GitHub's own completion was not recorded after the bad messages")
	assert.Equal(t, "succeeded", b.state(t, busy.Task).Result)
}

// TestSessionOfAnotherScaleSetIsRefused: GitHub answers the pod scale set's request for a
// message session with a session of the vm scale set. It is refused and counted, its queue is
// never read (a vm job gets no pod slot), and the next request gets the pod scale set's own.
func TestSessionOfAnotherScaleSetIsRefused(t *testing.T) {
	b := newSlotBed(t, 4)
	ctx := t.Context()
	sets, err := github.EnsureScaleSets(ctx, b.clients.Client(), tiers)
	require.NoError(t, err)
	vm := sets[1]
	intruder, err := b.clients.Client().MessageSessionClient(ctx, vm.ID, "someone-else", fastRetries())
	require.NoError(t, err)
	vmJob, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "vm"}})
	require.NoError(t, err)
	require.NoError(t, b.srv.AssignJob(vmJob))
	// The vm queue holds a message whose statistics count the assigned vm job.
	_, err = b.srv.QueueRawMessage(vm.ID, "RunnerScaleSetJobMessages", "[]")
	require.NoError(t, err)
	body, err := json.Marshal(intruder.Session())
	require.NoError(t, err)
	b.srv.InjectFault(githubtest.OpCreateSession, githubtest.Fault{Status: 200, Body: string(body)})

	run(t, b.sess)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(b.metrics.SessionHeld.WithLabelValues(itoa(b.pod.ID))) == 1
	}, 15*time.Second, 20*time.Millisecond, "the pod scale set's own session was not opened after the other one was refused")
	assert.Equal(t, 1.0, testutil.ToFloat64(b.metrics.SessionsRefused.WithLabelValues(itoa(b.pod.ID))))
	podJob, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { j, _ := b.srv.Job(podJob); return j.State == githubtest.JobAssigned && len(b.live()) > 0 },
		15*time.Second, 20*time.Millisecond, "the pod job was not served")
	require.Eventually(t, func() bool { return b.srv.PendingMessages(b.pod.ID) == 0 }, 10*time.Second, 20*time.Millisecond)
	assert.Len(t, b.live(), 1, "the vm scale set's assigned job got a pod slot")
	assert.Equal(t, 2, b.srv.PendingMessages(vm.ID), "the pod scale set's session read the vm scale set's queue")
	var owners []string
	for _, s := range b.srv.Sessions() {
		owners = append(owners, fmt.Sprintf("%d:%s", s.ScaleSetID, s.Owner))
	}
	assert.ElementsMatch(t, []string{itoa(b.pod.ID) + ":scheduler@test", itoa(vm.ID) + ":someone-else"}, owners)
}
