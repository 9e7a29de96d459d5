package github_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github"
	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/lease"
)

const (
	testAppID          = 4242
	testInstallationID = 77
)

var appKey = sync.OnceValue(func() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
})

// fastRetries retries twice with millisecond waits instead of the library's seconds.
func fastRetries() scaleset.HTTPOption {
	c := retryablehttp.NewClient()
	c.RetryMax = 2
	c.RetryWaitMin = time.Millisecond
	c.RetryWaitMax = 5 * time.Millisecond
	c.Logger = nil
	return scaleset.WithRetryableHTTPClint(c)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// bed is a fake GitHub, the controller's clients of it, and a JetStream for the leases.
type bed struct {
	srv     *githubtest.Server
	clients *github.Clients
	metrics *github.Metrics
	leases  jetstream.KeyValue
	log     *eventlog.Log
	view    *eventlog.View
}

func newBed(t *testing.T, mod ...func(*githubtest.Options)) *bed {
	t.Helper()
	opts := githubtest.Options{
		App:             &githubtest.App{ID: testAppID, ClientID: "Iv1.test", InstallationID: testInstallationID, PublicKey: &appKey().PublicKey},
		LongPollTimeout: 100 * time.Millisecond,
	}
	for _, m := range mod {
		m(&opts)
	}
	srv := githubtest.New(t, opts)
	key := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(appKey())})
	m := github.NewMetrics(nil)
	clients, err := github.NewClients(github.ClientsConfig{
		URL:     srv.OrgURL("acme"),
		Auth:    github.Auth{AppID: "4242", InstallationID: testInstallationID, PrivateKeyFile: writeFile(t, "app.pem", string(key))},
		Options: []scaleset.HTTPOption{fastRetries()},
		Metrics: m,
	})
	require.NoError(t, err)
	_, js := eventlogtest.Connect(t)
	cfg := eventlog.DefaultConfig()
	cfg.Key, cfg.LeasesTTL = eventlogtest.Key, lease.MinTTL
	l, err := eventlog.Open(t.Context(), js, cfg)
	require.NoError(t, err)
	v := eventlog.NewView()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Watch(ctx, v) }()
	t.Cleanup(func() { cancel(); <-done })
	return &bed{srv: srv, clients: clients, metrics: m, leases: l.Leases(), log: l, view: v}
}

var tiers = github.ScaleSets{Prefix: "dynrunner", RunnerGroup: github.DefaultRunnerGroup, Tiers: []assignment.Backend{assignment.BackendPod, assignment.BackendVM}}

func TestEnsureScaleSetsCreatesThenAdopts(t *testing.T) {
	b := newBed(t)
	ctx := t.Context()
	sets, err := github.EnsureScaleSets(ctx, b.clients.Client(), tiers)
	require.NoError(t, err)
	require.Len(t, sets, 2)
	assert.Equal(t, "dynrunner-pod", sets[0].Name)
	assert.Equal(t, "dynrunner-vm", sets[1].Name)
	require.Len(t, b.srv.ScaleSets(), 2)

	// A vm job reaches only the vm scale set, a pod job only the pod one.
	vmJob, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "vm"}})
	require.NoError(t, err)
	podJob, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	j, err := b.srv.Job(vmJob)
	require.NoError(t, err)
	assert.Equal(t, sets[1].ID, j.ScaleSetID, "a vm job went to another scale set")
	j, err = b.srv.Job(podJob)
	require.NoError(t, err)
	assert.Equal(t, sets[0].ID, j.ScaleSetID, "a pod job went to another scale set")

	// Someone edits the pod scale set's labels: a restart sets them back and creates nothing.
	c := b.clients.Client()
	set, err := c.GetRunnerScaleSetByID(ctx, sets[0].ID)
	require.NoError(t, err)
	set.Labels = []scaleset.Label{{Type: "System", Name: "self-hosted"}, {Type: "System", Name: "gpu"}}
	_, err = c.UpdateRunnerScaleSet(ctx, set.ID, set)
	require.NoError(t, err)

	again, err := github.EnsureScaleSets(ctx, c, tiers)
	require.NoError(t, err)
	assert.Equal(t, sets, again, "a restart did not adopt the same scale sets")
	require.Len(t, b.srv.ScaleSets(), 2, "a restart created scale sets")
	set, err = c.GetRunnerScaleSetByID(ctx, sets[0].ID)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"self-hosted", "pod"}, labelNames(set.Labels))

	_, err = github.EnsureScaleSets(ctx, c, github.ScaleSets{Prefix: "x", RunnerGroup: "no-such-group", Tiers: tiers.Tiers})
	require.ErrorContains(t, err, "GITHUB_RUNNER_GROUP", "an unknown runner group's error does not say what to set")
}

func labelNames(ls []scaleset.Label) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Name)
	}
	return out
}

// recorder is a Handler that records which replica handled which message.
type recorder struct {
	mu   sync.Mutex
	seen map[string][]int64 // holder → job ids of JobAvailable messages handled
	fail atomic.Bool
}

func (r *recorder) Handle(_ context.Context, s *github.Session, msg *scaleset.RunnerScaleSetMessage) error {
	if r.fail.Load() {
		return assert.AnError
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, j := range msg.JobAvailableMessages {
		r.seen[s.Client().Session().OwnerName] = append(r.seen[s.Client().Session().OwnerName], j.RunnerRequestID)
	}
	return nil
}

func (r *recorder) Reconcile(context.Context, *github.Session) error { return nil }

func (r *recorder) handled(holder string) []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.seen[holder]...)
}

func (b *bed) session(set github.ScaleSet, holder string, h github.Handler) *github.Session {
	return github.NewSession(github.SessionConfig{
		Set: set, Clients: b.clients, Leases: b.leases, TTL: lease.MinTTL, Holder: holder,
		Capacity: func() int { return 4 }, Handler: h, Retry: 100 * time.Millisecond,
		Options: []scaleset.HTTPOption{fastRetries()}, Log: zerolog.Nop(), Metrics: b.metrics,
	})
}

// run runs s (a Session, Reruns) until the test ends or stop is called, and checks that it
// stops and returns nil.
func run(t *testing.T, s interface{ Run(context.Context) error }) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				assert.NoError(t, err)
			case <-time.After(15 * time.Second):
				assert.Fail(t, "a session or the reruns did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestOneSessionAcrossReplicas: two replicas run the pod scale set's session; GitHub never sees
// two sessions, a queued job's message is handled by the holder, and when the holder stops the
// other opens the session and handles what comes next.
func TestOneSessionAcrossReplicas(t *testing.T) {
	b := newBed(t)
	sets, err := github.EnsureScaleSets(t.Context(), b.clients.Client(), tiers)
	require.NoError(t, err)
	pod := sets[0]

	// Watch GitHub's side throughout: never two sessions of the scale set.
	var most atomic.Int32
	watch, stopWatch := context.WithCancel(t.Context())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for watch.Err() == nil {
			n := int32(0)
			for _, s := range b.srv.Sessions() {
				if s.ScaleSetID == pod.ID {
					n++
				}
			}
			if n > most.Load() {
				most.Store(n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	rec := &recorder{seen: map[string][]int64{}}
	a, c := b.session(pod, "scheduler@a", rec), b.session(pod, "scheduler@b", rec)
	stopA := run(t, a)
	require.Eventually(t, func() bool { return a.Held() && len(b.srv.Sessions()) == 1 }, 10*time.Second, 20*time.Millisecond,
		"the first replica did not open the session")
	stopC := run(t, c)

	first, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(rec.handled("scheduler@a")) == 1 }, 10*time.Second, 20*time.Millisecond,
		"the holder did not handle the job's message")
	assert.Equal(t, []int64{first}, rec.handled("scheduler@a"))
	assert.Empty(t, rec.handled("scheduler@b"), "the replica without the lease handled a message")
	assert.Equal(t, 1.0, testutil.ToFloat64(b.metrics.SessionHeld.WithLabelValues(itoa(pod.ID))))
	// The replica without the lease does not even try: GitHub would refuse it (409), and
	// retrying that would spend the installation's rate limit.
	require.Eventually(t, func() bool { return b.srv.Requests(githubtest.OpGetMessage) >= 5 }, 10*time.Second, 20*time.Millisecond)
	assert.Zero(t, testutil.ToFloat64(b.metrics.SessionConflicts.WithLabelValues(itoa(pod.ID))),
		"the replica without the lease tried to open a second session")

	stopA() // a clean stop closes the session and releases the lease: the other takes over
	require.Eventually(t, func() bool {
		ss := b.srv.Sessions()
		return len(ss) == 1 && ss[0].Owner == "scheduler@b"
	}, 10*time.Second, 20*time.Millisecond, "the second replica did not open the session after the first stopped")
	second, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(rec.handled("scheduler@b")) == 1 }, 10*time.Second, 20*time.Millisecond,
		"the new holder did not handle the next job's message")
	assert.Equal(t, []int64{second}, rec.handled("scheduler@b"), "the new holder got a message the old one had acknowledged")

	stopC()
	stopWatch()
	<-watched
	assert.Equal(t, int32(1), most.Load(), "GitHub saw more than one session of the scale set at once")
	assert.Empty(t, b.srv.Sessions(), "a stopped replica left its session open")
}

// TestUnhandledMessageIsHandledAgain: a message whose handling failed is not acknowledged; it
// is handled once the handler recovers.
func TestUnhandledMessageIsHandledAgain(t *testing.T) {
	b := newBed(t)
	sets, err := github.EnsureScaleSets(t.Context(), b.clients.Client(), tiers)
	require.NoError(t, err)
	rec := &recorder{seen: map[string][]int64{}}
	rec.fail.Store(true)
	s := b.session(sets[0], "scheduler@a", rec)
	run(t, s)
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.srv.Requests(githubtest.OpGetMessage) >= 3 }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 1, b.srv.PendingMessages(sets[0].ID), "a message whose handling failed was acknowledged")
	rec.fail.Store(false)
	require.Eventually(t, func() bool { return len(rec.handled("scheduler@a")) == 1 }, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, []int64{job}, rec.handled("scheduler@a"))
	require.Eventually(t, func() bool { return b.srv.PendingMessages(sets[0].ID) == 0 }, 10*time.Second, 20*time.Millisecond,
		"the handled message was not acknowledged")
}

// TestSessionConflictWaits: another session of the scale set exists (an earlier holder that
// died without closing it): the replica holding the lease counts the conflict, opens nothing
// beside it, and opens its session once the other is gone.
func TestSessionConflictWaits(t *testing.T) {
	b := newBed(t)
	sets, err := github.EnsureScaleSets(t.Context(), b.clients.Client(), tiers)
	require.NoError(t, err)
	pod := sets[0]
	other, err := b.clients.Client().MessageSessionClient(t.Context(), pod.ID, "a-dead-holder", fastRetries())
	require.NoError(t, err)

	s := b.session(pod, "scheduler@a", &recorder{seen: map[string][]int64{}})
	run(t, s)
	conflicts := b.metrics.SessionConflicts.WithLabelValues(itoa(pod.ID))
	require.Eventually(t, func() bool { return testutil.ToFloat64(conflicts) >= 2 }, 10*time.Second, 20*time.Millisecond,
		"the replica did not meet (and retry) the other session's conflict")
	require.Len(t, b.srv.Sessions(), 1)
	assert.Equal(t, "a-dead-holder", b.srv.Sessions()[0].Owner)

	require.NoError(t, other.Close(t.Context())) // GitHub timing the dead holder's session out
	require.Eventually(t, func() bool {
		ss := b.srv.Sessions()
		return len(ss) == 1 && ss[0].Owner == "scheduler@a"
	}, 10*time.Second, 20*time.Millisecond, "the replica did not open its session once the other was gone")
}

func itoa(n int) string { return strconv.Itoa(n) }

// clock is a settable clock for Clients' refresh interval.
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

// TestTokenFileRotation: the operator replaces the token file and revokes the old token; the
// next call uses the new one. A refresh that cannot read its file keeps the last client,
// counts the failure and says so in dynrunner_github_credential_ok; GitHub refusing the
// client makes the next call refresh.
func TestTokenFileRotation(t *testing.T) {
	srv := githubtest.New(t, githubtest.Options{Tokens: []string{"ghp_first"}, LongPollTimeout: 100 * time.Millisecond})
	path := writeFile(t, "token", "ghp_first\n")
	m := github.NewMetrics(nil)
	clk := &clock{now: time.Now()}
	clients, err := github.NewClients(github.ClientsConfig{
		URL: srv.OrgURL("acme"), Auth: github.Auth{TokenFile: path}, Refresh: time.Hour,
		Options: []scaleset.HTTPOption{fastRetries()}, Metrics: m, Now: clk.Now, Log: zerolog.Nop(),
	})
	require.NoError(t, err)
	ctx := t.Context()
	first := clients.Client()
	_, err = github.EnsureScaleSets(ctx, first, tiers)
	require.NoError(t, err)
	assert.Same(t, first, clients.Client(), "an unchanged token file made a new client")

	require.NoError(t, os.WriteFile(path, []byte("ghp_second"), 0o600))
	srv.SetTokens("ghp_second")
	second := clients.Client()
	require.NotSame(t, first, second, "a rotated token file was not picked up")
	srv.ExpireAdminTokens() // the old client's admin token is gone too: only a new exchange works
	_, err = github.EnsureScaleSets(ctx, second, tiers)
	require.NoError(t, err, "the client made from the rotated token failed")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Refreshes.WithLabelValues("ok")))

	// The file cannot be read at the refresh: the last client stays, the failure shows.
	require.NoError(t, os.Remove(path))
	clk.Advance(time.Hour)
	assert.Same(t, second, clients.Client(), "a failed refresh did not keep the last client")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Refreshes.WithLabelValues("failed")))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.CredentialOK), "a failed refresh does not show in dynrunner_github_credential_ok")

	// Back, and GitHub refused the client: the next call makes a new one.
	require.NoError(t, os.WriteFile(path, []byte("ghp_second"), 0o600))
	clients.Refused()
	third := clients.Client()
	require.NotSame(t, second, third)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.CredentialOK))
}

// TestCredentialsFailClosed: missing, contradictory or unreadable credentials refuse the boot
// with an error naming the variable to set.
func TestCredentialsFailClosed(t *testing.T) {
	key := writeFile(t, "app.pem", "not a key")
	for _, tc := range []struct {
		name string
		auth github.Auth
		url  string
		want string
	}{
		{"nothing", github.Auth{}, "https://github.com/acme", "GITHUB_TOKEN_FILE"},
		{"both", github.Auth{AppID: "1", InstallationID: 2, PrivateKeyFile: key, TokenFile: key}, "https://github.com/acme", "use one"},
		{"app without installation", github.Auth{AppID: "1", PrivateKeyFile: key}, "https://github.com/acme", "GITHUB_APP_INSTALLATION_ID"},
		{"missing token file", github.Auth{TokenFile: filepath.Join(t.TempDir(), "none")}, "https://github.com/acme", "GITHUB_TOKEN_FILE"},
		{"empty token file", github.Auth{TokenFile: writeFile(t, "empty", "\n")}, "https://github.com/acme", "is empty"},
		{"missing key file", github.Auth{AppID: "1", InstallationID: 2, PrivateKeyFile: filepath.Join(t.TempDir(), "none")}, "https://github.com/acme", "GITHUB_APP_PRIVATE_KEY_FILE"},
		{"no URL", github.Auth{TokenFile: key}, "", "GITHUB_CONFIG_URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := github.NewClients(github.ClientsConfig{URL: tc.url, Auth: tc.auth})
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestSessionOfADeadHolderTimesOut: a holder that died leaves its session open; once GitHub
// times it out (the fake's SessionTimeout), the next holder opens its own.
func TestSessionOfADeadHolderTimesOut(t *testing.T) {
	b := newBed(t, func(o *githubtest.Options) { o.SessionTimeout = 2 * time.Second })
	sets, err := github.EnsureScaleSets(t.Context(), b.clients.Client(), tiers)
	require.NoError(t, err)
	_, err = b.clients.Client().MessageSessionClient(t.Context(), sets[0].ID, "a-dead-holder", fastRetries())
	require.NoError(t, err)
	run(t, b.session(sets[0], "scheduler@a", &recorder{seen: map[string][]int64{}}))
	require.Eventually(t, func() bool {
		ss := b.srv.Sessions()
		return len(ss) == 1 && ss[0].Owner == "scheduler@a"
	}, 10*time.Second, 20*time.Millisecond, "the next holder did not open its session once the dead one's timed out")
	assert.Positive(t, testutil.ToFloat64(b.metrics.SessionConflicts.WithLabelValues(itoa(sets[0].ID))))
}
