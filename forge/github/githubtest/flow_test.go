package githubtest_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
)

// TestFlow drives one job through its whole life with the unmodified client: scale set, session,
// JobAvailable, acquire, JIT runner, JobAssigned, JobStarted, JobCompleted, cleanup.
func TestFlow(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)

	group, err := c.GetRunnerGroupByName(ctx, scaleset.DefaultRunnerGroup)
	require.NoError(t, err)
	assert.Equal(t, 1, group.ID)

	set := podScaleSet(ctx, t, c)
	assert.Equal(t, set.ID, podScaleSet(ctx, t, c).ID, "the second call gets the scale set the first created")
	byID, err := c.GetRunnerScaleSetByID(ctx, set.ID)
	require.NoError(t, err)
	assert.Equal(t, []scaleset.Label{{Type: "System", Name: "self-hosted"}, {Type: "System", Name: "pod"}}, byID.Labels)

	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)
	require.NotNil(t, sess.Session().Statistics)
	_, err = c.MessageSessionClient(ctx, set.ID, "replica-b")
	require.ErrorContains(t, err, githubtest.ExceptionSessionConflict, "a second session for the scale set is refused")
	require.ErrorContains(t, err, "409")
	require.Len(t, srv.Sessions(), 1)

	// An empty poll answers 202, which the client turns into no message.
	msg, err := sess.GetMessage(ctx, 0, 2)
	require.NoError(t, err)
	require.Nil(t, msg)

	jobID, err := srv.QueueJob(githubtest.JobSpec{Labels: podLabels, DisplayName: "build"})
	require.NoError(t, err)
	msg = nextMessage(ctx, t, sess, 0)
	require.Len(t, msg.JobAvailableMessages, 1)
	avail := msg.JobAvailableMessages[0]
	assert.Equal(t, jobID, avail.RunnerRequestID)
	assert.Equal(t, podLabels, avail.RequestLabels)
	assert.Equal(t, "build", avail.JobDisplayName)
	assert.NotEmpty(t, avail.AcquireJobURL)
	assert.Equal(t, 1, msg.Statistics.TotalAvailableJobs)
	assert.Equal(t, 2, srv.Sessions()[0].MaxCapacity, "the poll's X-ScaleSetMaxCapacity is recorded")
	assert.Zero(t, srv.PendingMessages(set.ID), "DeleteMessage acknowledged it")

	acquired, err := sess.AcquireJobs(ctx, []int64{jobID, 999})
	require.NoError(t, err)
	assert.Equal(t, []int64{jobID}, acquired, "only the scale set's available job is acquired")

	jit, err := c.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: "slot-1", WorkFolder: "_work"}, set.ID)
	require.NoError(t, err)
	assert.Equal(t, "slot-1", jit.Runner.Name)
	assert.Equal(t, set.ID, jit.Runner.RunnerScaleSetID)
	cfg, err := githubtest.DecodeJITConfig(jit.EncodedJITConfig)
	require.NoError(t, err)
	assert.Equal(t, jit.Runner.ID, cfg.AgentID)
	assert.Equal(t, "slot-1", cfg.AgentName)
	assert.NotEmpty(t, cfg.Credential)

	require.NoError(t, srv.AssignJob(jobID))
	msg = nextMessage(ctx, t, sess, msg.MessageID)
	require.Len(t, msg.JobAssignedMessages, 1)
	assert.Equal(t, jobID, msg.JobAssignedMessages[0].RunnerRequestID)
	assert.Equal(t, 1, msg.Statistics.TotalAssignedJobs)
	assert.Equal(t, 1, msg.Statistics.TotalIdleRunners)

	runnerID, err := srv.StartJob(jobID, 0)
	require.NoError(t, err)
	assert.Equal(t, jit.Runner.ID, runnerID, "the only idle runner takes the job")
	msg = nextMessage(ctx, t, sess, msg.MessageID)
	require.Len(t, msg.JobStartedMessages, 1)
	assert.Equal(t, runnerID, msg.JobStartedMessages[0].RunnerID)
	assert.Equal(t, "slot-1", msg.JobStartedMessages[0].RunnerName)
	assert.Equal(t, 1, msg.Statistics.TotalRunningJobs)
	assert.Equal(t, 1, msg.Statistics.TotalBusyRunners)

	err = c.RemoveRunner(ctx, int64(runnerID))
	require.ErrorIs(t, err, scaleset.JobStillRunningError, "a busy runner cannot be removed")

	require.NoError(t, srv.CompleteJob(jobID, "succeeded"))
	msg = nextMessage(ctx, t, sess, msg.MessageID)
	require.Len(t, msg.JobCompletedMessages, 1)
	done := msg.JobCompletedMessages[0]
	assert.Equal(t, "succeeded", done.Result)
	assert.Equal(t, runnerID, done.RunnerID)
	assert.Equal(t, jobID, done.RunnerRequestID)
	_, err = c.GetRunner(ctx, runnerID)
	require.ErrorIs(t, err, scaleset.RunnerNotFoundError, "a JIT runner is gone after its job")

	// A runner that never took a job is removed by id.
	idle, err := c.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: "slot-2"}, set.ID)
	require.NoError(t, err)
	got, err := c.GetRunnerByName(ctx, "slot-2")
	require.NoError(t, err)
	assert.Equal(t, idle.Runner.ID, got.ID)
	require.NoError(t, c.RemoveRunner(ctx, int64(idle.Runner.ID)))
	assert.Empty(t, srv.Runners())

	require.NoError(t, sess.Close(ctx))
	assert.Empty(t, srv.Sessions())
	again, err := c.MessageSessionClient(ctx, set.ID, "replica-b")
	require.NoError(t, err, "once the session is deleted another replica may open one")
	require.NoError(t, again.Close(ctx))

	counts := srv.Counts()
	assert.Equal(t, 1, counts.AdminTokens, "an hour-long admin token is fetched once")
	assert.Equal(t, 1, counts.InstallationTokens)
}

// TestLongPollReturnsWhenMessageQueued shows the poll answering as soon as a job is queued, well
// before its timeout.
func TestLongPollReturnsWhenMessageQueued(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.LongPollTimeout = time.Minute })
	c := appClient(t, srv)
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)

	type result struct {
		msg *scaleset.RunnerScaleSetMessage
		err error
	}
	got := make(chan result, 1)
	go func() {
		msg, err := sess.GetMessage(ctx, 0, 1)
		got <- result{msg, err}
	}()
	require.Eventually(t, func() bool { return srv.Requests(githubtest.OpGetMessage) == 1 }, 5*time.Second, time.Millisecond, "the poll is open")
	jobID, err := srv.QueueJob(githubtest.JobSpec{Labels: podLabels})
	require.NoError(t, err)

	select {
	case r := <-got:
		require.NoError(t, r.err)
		require.NotNil(t, r.msg)
		require.Len(t, r.msg.JobAvailableMessages, 1)
		assert.Equal(t, jobID, r.msg.JobAvailableMessages[0].RunnerRequestID)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the long poll did not return when a message was queued")
	}
}

// TestMessagesBatchAndRedeliver shows job messages batched into one message while nobody has
// fetched it, and an undeleted message delivered again to a poll without lastMessageId.
func TestMessagesBatchAndRedeliver(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.AssignOnAcquire = true })
	c := appClient(t, srv)
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)

	first, err := srv.QueueJob(githubtest.JobSpec{Labels: podLabels})
	require.NoError(t, err)
	second, err := srv.QueueJob(githubtest.JobSpec{Labels: []string{"pod"}})
	require.NoError(t, err)

	msg, err := sess.GetMessage(ctx, 0, 2)
	require.NoError(t, err)
	require.NotNil(t, msg)
	require.Len(t, msg.JobAvailableMessages, 2)
	assert.Equal(t, []int64{first, second}, []int64{msg.JobAvailableMessages[0].RunnerRequestID, msg.JobAvailableMessages[1].RunnerRequestID})
	assert.Equal(t, 2, msg.Statistics.TotalAvailableJobs)

	again, err := sess.GetMessage(ctx, 0, 2)
	require.NoError(t, err)
	require.NotNil(t, again)
	assert.Equal(t, msg.MessageID, again.MessageID, "an unacknowledged message comes again")
	none, err := sess.GetMessage(ctx, msg.MessageID, 2)
	require.NoError(t, err)
	assert.Nil(t, none, "nothing above lastMessageId")
	require.NoError(t, sess.DeleteMessage(ctx, msg.MessageID))

	// With AssignOnAcquire the acquisition itself sends JobAssigned.
	_, err = sess.AcquireJobs(ctx, []int64{first, second})
	require.NoError(t, err)
	msg = nextMessage(ctx, t, sess, msg.MessageID)
	require.Len(t, msg.JobAssignedMessages, 2)
	assert.Equal(t, 2, msg.Statistics.TotalAssignedJobs)
}

// TestStartJobOnNamedRunner shows a test choosing the runner, and the errors of the Go API.
func TestStartJobOnNamedRunner(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.AssignOnAcquire = true })
	c := appClient(t, srv)
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)

	_, err = srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "vm"}})
	require.ErrorIs(t, err, githubtest.ErrNoScaleSet)
	jobID, err := srv.QueueJob(githubtest.JobSpec{Labels: podLabels})
	require.NoError(t, err)
	_, err = srv.StartJob(jobID, 0)
	require.ErrorIs(t, err, githubtest.ErrJobState, "a job not yet assigned cannot start")
	_, err = sess.AcquireJobs(ctx, []int64{jobID})
	require.NoError(t, err)
	_, err = srv.StartJob(jobID, 0)
	require.ErrorIs(t, err, githubtest.ErrNoIdleRunner)

	var ids []int
	for _, name := range []string{"slot-a", "slot-b"} {
		jit, err := c.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: name}, set.ID)
		require.NoError(t, err)
		ids = append(ids, jit.Runner.ID)
	}
	_, err = c.GenerateJitRunnerConfig(ctx, &scaleset.RunnerScaleSetJitRunnerSetting{Name: "slot-a"}, set.ID)
	require.ErrorIs(t, err, scaleset.RunnerExistsError)

	got, err := srv.StartJob(jobID, ids[1])
	require.NoError(t, err)
	assert.Equal(t, ids[1], got)
	job, err := srv.Job(jobID)
	require.NoError(t, err)
	assert.Equal(t, githubtest.JobRunning, job.State)
	assert.Equal(t, "slot-b", job.RunnerName)
	require.NoError(t, srv.CompleteJob(jobID, "failed"))
	require.ErrorIs(t, srv.CompleteJob(jobID, "failed"), githubtest.ErrJobState)
	_, err = srv.Job(999)
	require.ErrorIs(t, err, githubtest.ErrUnknownJob)
	assert.Equal(t, []githubtest.Runner{{ID: ids[0], Name: "slot-a", ScaleSetID: set.ID}}, srv.Runners())
}

// TestCloseEndsLongPoll shows Close answering an open long poll instead of waiting out its
// timeout.
func TestCloseEndsLongPoll(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.LongPollTimeout = time.Hour })
	c := appClient(t, srv)
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)

	polled := make(chan error, 1)
	go func() {
		_, err := sess.GetMessage(ctx, 0, 1)
		polled <- err
	}()
	require.Eventually(t, func() bool { return srv.Requests(githubtest.OpGetMessage) == 1 }, 5*time.Second, time.Millisecond)
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	select {
	case err := <-polled:
		require.NoError(t, err, "the open poll is answered 202")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "Close left the long poll open")
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "Close did not return")
	}
	srv.Close() // idempotent
}

// TestServesOnAGivenListener: with Options.Listener the fake serves there, and the URLs it
// hands out (the Actions service's, so the JIT configurations') name that address.
func TestServesOnAGivenListener(t *testing.T) {
	ctx := testContext(t)
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	srv := newServer(t, func(o *githubtest.Options) { o.Listener = ln })
	require.Equal(t, "http://"+ln.Addr().String(), srv.URL())
	assert.True(t, strings.HasPrefix(srv.ActionsServiceURL(), srv.URL()+"/"), "Actions service at %s", srv.ActionsServiceURL())
	set := podScaleSet(ctx, t, appClient(t, srv))
	assert.NotZero(t, set.ID)
}

// TestTLSOnAGivenListener: with Options.Listener and Options.TLS the fake presents a
// certificate of its own naming the listener's address, which httptest's does not (it names
// 127.0.0.1 and ::1 only), so the client and the stand-in runner verify it at that address.
func TestTLSOnAGivenListener(t *testing.T) {
	ctx := testContext(t)
	ln, err := net.Listen("tcp4", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no loopback address 127.0.0.2 here: %v", err)
	}
	srv := newServer(t, func(o *githubtest.Options) { o.Listener = ln; o.TLS = true })
	require.Equal(t, "https://"+ln.Addr().String(), srv.URL())

	c, err := scaleset.NewClientWithPersonalAccessToken(scaleset.NewClientWithPersonalAccessTokenConfig{
		GitHubConfigURL: srv.OrgURL("octo"), PersonalAccessToken: testPAT,
	}, fastRetries(0), scaleset.WithRootCAs(srv.RootCAs()))
	require.NoError(t, err)
	set := podScaleSet(ctx, t, c)
	assert.NotZero(t, set.ID)

	// The PEM the stand-in runner is given verifies the address too.
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(srv.CertificatePEM()))
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
	require.NoError(t, err, "a client verifying %s", ln.Addr())
	require.NoError(t, conn.Close())
}
