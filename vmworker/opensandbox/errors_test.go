package opensandbox_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox/opensandboxtest"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestUnauthorized(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	tests := []struct {
		name  string
		setup func(*opensandbox.Config)
		auth  int
	}{
		{name: "wrong key 401", setup: func(c *opensandbox.Config) { c.APIKey = []byte("not-the-key-" + f.srv.APIKey()[:4]) }},
		{name: "key refused 401", auth: http.StatusUnauthorized},
		{name: "key forbidden 403", auth: http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := f.backend(t, tt.setup)
			f.srv.SetAuthStatus(tt.auth)
			t.Cleanup(func() { f.srv.SetAuthStatus(0) })
			before := len(f.srv.Requests())
			_, err := b.Start(ctxT(t), spec(101, opensandboxtest.ScriptRun))
			f.checkErr(t, err)
			assert.ErrorIs(t, err, opensandbox.ErrUnauthorized, "Start error")
			assert.ErrorContains(t, err, "refused the API key", "Start error does not say the API key was refused")
			assert.Equal(t, 1, len(f.srv.Requests())-before, "requests: a refused key is not retried")
			_, err = b.List(ctxT(t))
			f.checkErr(t, err)
			assert.ErrorIs(t, err, opensandbox.ErrUnauthorized, "List error")
			err = b.Destroy(ctxT(t), podworker.Handle{Backend: b.Name(), ID: "some-sandbox"})
			f.checkErr(t, err)
			assert.ErrorIs(t, err, opensandbox.ErrUnauthorized, "Destroy error")
			assert.Zero(t, f.issued(t), "a nonce was issued although no sandbox can be created")
		})
	}
}

func TestNotFound(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	h := podworker.Handle{Backend: b.Name(), ID: "0b4f9f1e-5d59-4c39-8d5e-000000000000", Task: 5, Epoch: 1}
	assert.NoError(t, b.Destroy(ctxT(t), h), "Destroy of a sandbox that does not exist (404)")
	_, err := b.Wait(ctxT(t), h)
	f.checkErr(t, err)
	assert.ErrorIs(t, err, podworker.ErrNotFound, "Wait on a sandbox that does not exist")
}

func TestConflict(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)

	f.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Status: http.StatusConflict, Code: "SANDBOX::CONFLICT", Message: "conflicts"})
	_, err := b.Start(ctxT(t), spec(201, opensandboxtest.ScriptRun))
	f.checkErr(t, err)
	assert.ErrorIs(t, err, opensandbox.ErrConflict, "Start error")
	assert.Equal(t, 1, f.count(http.MethodPost, "/sandboxes"), "creates: a 409 is not retried")

	h, err := b.Start(ctxT(t), spec(202, opensandboxtest.ScriptRun))
	require.NoError(t, err, "Start")
	// 409 on delete while the sandbox runs: an error.
	f.srv.Inject(opensandboxtest.Fault{Method: http.MethodDelete, Status: http.StatusConflict})
	err = b.Destroy(ctxT(t), h)
	f.checkErr(t, err)
	assert.ErrorIs(t, err, opensandbox.ErrConflict, "Destroy error")
	// 409 on delete because the sandbox is already stopping: done.
	f.srv.SetState(h.ID, opensandbox.StateStopping, "user_delete", "")
	f.srv.Inject(opensandboxtest.Fault{Method: http.MethodDelete, Status: http.StatusConflict})
	assert.NoError(t, b.Destroy(ctxT(t), h), "Destroy of a stopping sandbox answered 409")
}

func TestRateLimited(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)

	t.Run("RetryAfterHonoured", func(t *testing.T) {
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Status: http.StatusTooManyRequests, RetryAfter: "1"})
		began := time.Now()
		_, err := b.List(ctxT(t))
		require.NoError(t, err, "List after one 429")
		took := time.Since(began)
		assert.GreaterOrEqual(t, took, time.Second, "List took %v, want at least the 1s Retry-After", took)
	})
	t.Run("CreateRetried", func(t *testing.T) {
		// A 429 is answered before anything happens, so even a create is sent again.
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Status: http.StatusTooManyRequests})
		before := f.count(http.MethodPost, "/sandboxes")
		h, err := b.Start(ctxT(t), spec(301, opensandboxtest.ScriptRun))
		require.NoError(t, err, "Start after one 429")
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		assert.Equal(t, 2, f.count(http.MethodPost, "/sandboxes")-before, "creates")
	})
	t.Run("RetryAfterTooLong", func(t *testing.T) {
		b := f.backend(t, func(c *opensandbox.Config) { c.MaxRetryWait = 2 * time.Second })
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Status: http.StatusTooManyRequests, RetryAfter: "3600"})
		began := time.Now()
		_, err := b.List(ctxT(t))
		f.checkErr(t, err)
		assert.ErrorIs(t, err, opensandbox.ErrRateLimited, "List error")
		took := time.Since(began)
		assert.LessOrEqual(t, took, time.Second, "List took %v: it waited for a Retry-After it cannot honour", took)
	})
	t.Run("Persistent", func(t *testing.T) {
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Status: http.StatusTooManyRequests, Count: 100})
		t.Cleanup(f.srv.ClearFaults)
		_, err := b.List(ctxT(t))
		f.checkErr(t, err)
		assert.ErrorIs(t, err, opensandbox.ErrRateLimited, "List error")
	})
}

func TestServerErrors(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)

	t.Run("RetriedThenSucceeds", func(t *testing.T) {
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Status: http.StatusServiceUnavailable, Count: 2})
		_, err := b.List(ctxT(t))
		require.NoError(t, err, "List after two 503")
	})
	t.Run("GivenUp", func(t *testing.T) {
		b := f.backend(t, func(c *opensandbox.Config) { c.Retries = 3 })
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Status: http.StatusInternalServerError, Count: 4})
		before := f.count(http.MethodGet, "/sandboxes")
		_, err := b.List(ctxT(t))
		f.checkErr(t, err)
		assert.ErrorIs(t, err, opensandbox.ErrUnavailable, "List error")
		assert.Equal(t, 4, f.count(http.MethodGet, "/sandboxes")-before, "requests (3 retries)")
		assert.ErrorContains(t, err, "after 4 attempts", "the error does not say how often it tried")
	})
	t.Run("CreateLostAnswer", func(t *testing.T) {
		// The server creates the sandbox, then answers 500: Start must find it, not make two.
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Status: http.StatusInternalServerError, AfterEffect: true})
		sp := spec(401, opensandboxtest.ScriptRun)
		h, err := b.Start(ctxT(t), sp)
		require.NoError(t, err, "Start")
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		assert.Equal(t, 1, countTask(f, sp.Task.String()), "sandboxes of the task")
		assert.Equal(t, 1, f.count(http.MethodPost, "/sandboxes"), "creates")
	})
	t.Run("CreateFailsBeforeEffect", func(t *testing.T) {
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Status: http.StatusBadGateway})
		sp := spec(402, opensandboxtest.ScriptRun)
		h, err := b.Start(ctxT(t), sp)
		require.NoError(t, err, "Start")
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		assert.Equal(t, 1, countTask(f, sp.Task.String()), "sandboxes of the task")
	})
	t.Run("WaitRidesOut", func(t *testing.T) {
		h, err := b.Start(ctxT(t), spec(403, opensandboxtest.ScriptExit))
		require.NoError(t, err, "Start")
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		// More failures than one request retries: Wait polls on.
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Status: http.StatusBadGateway, Count: 3 * (opensandbox.DefaultRetries + 1)})
		exit, err := b.Wait(ctxT(t), h)
		require.NoError(t, err, "Wait through 5xx answers")
		assert.Contains(t, exit.Reason, "terminated", "exit = %+v, want the terminated sandbox", exit)
	})
}

// countTask returns how many sandboxes of task exist on the fake.
func countTask(f *fixture, task string) int {
	n := 0
	for _, sb := range f.srv.Sandboxes() {
		if sb.Metadata[opensandbox.MetaTask] == task {
			n++
		}
	}
	return n
}

func TestRequestTimeout(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, func(c *opensandbox.Config) { c.Timeout = 50 * time.Millisecond; c.Retries = 1 })
	f.srv.SetDelay(time.Second)
	began := time.Now()
	_, err := b.List(ctxT(t))
	f.checkErr(t, err)
	assert.ErrorIs(t, err, opensandbox.ErrUnavailable, "List error")
	assert.ErrorIs(t, err, context.DeadlineExceeded, "List error")
	assert.ErrorContains(t, err, "no answer within 50ms", "the error does not name the request timeout")
	took := time.Since(began)
	assert.LessOrEqual(t, took, 900*time.Millisecond, "List took %v: the request timeout did not apply", took)
	f.srv.SetDelay(0)

	// A slow answer within the timeout is fine.
	f.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Delay: 20 * time.Millisecond})
	_, err = b.List(ctxT(t))
	assert.NoError(t, err, "List with a slow answer")
}

func TestCallerDeadline(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	f.srv.SetNeverRunning(true)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := b.Start(ctx, spec(501, opensandboxtest.ScriptRun))
	f.checkErr(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "Start error")
	assert.True(t, poll(5*time.Second, func() bool { return countTask(f, "501") == 0 }),
		"the sandbox of a cancelled Start is left: %+v", f.srv.Sandboxes())
}

func TestNeverRunning(t *testing.T) {
	for _, tt := range []struct {
		name   string
		setup  func(*fixture)
		script opensandboxtest.Script
		want   error
	}{
		{name: "PoolExhausted", setup: func(f *fixture) { f.srv.SetNeverRunning(true) }, script: opensandboxtest.ScriptRun, want: opensandbox.ErrStartTimeout},
		{name: "FailsWhileProvisioning", script: opensandboxtest.ScriptFailStart, want: opensandbox.ErrSandboxFailed},
		{name: "UnknownPool", script: opensandboxtest.ScriptRun, want: opensandbox.ErrStartTimeout},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, opensandboxtest.ServerConfig{Pools: []string{"ci-vm"}})
			if tt.setup != nil {
				tt.setup(f)
			}
			b := f.backend(t, func(c *opensandbox.Config) {
				c.StartTimeout = 200 * time.Millisecond
				if tt.name == "UnknownPool" {
					c.Pool = "no-such-pool"
				}
			})
			began := time.Now()
			_, err := b.Start(ctxT(t), spec(601, tt.script))
			f.checkErr(t, err)
			assert.ErrorIs(t, err, tt.want, "Start error")
			took := time.Since(began)
			assert.LessOrEqual(t, took, 3*time.Second, "Start took %v with a start timeout of 200ms", took)
			assert.Empty(t, f.srv.Sandboxes(), "the failed sandbox was not deleted")
		})
	}
}

func TestMalformed(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)

	t.Run("List", func(t *testing.T) {
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Malformed: true})
		_, err := b.List(ctxT(t))
		f.checkErr(t, err)
		assert.ErrorIs(t, err, opensandbox.ErrMalformed, "List error")
	})
	t.Run("Wait", func(t *testing.T) {
		h, err := b.Start(ctxT(t), spec(701, opensandboxtest.ScriptRun))
		require.NoError(t, err, "Start")
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Malformed: true})
		_, err = b.Wait(ctxT(t), h)
		f.checkErr(t, err)
		assert.ErrorIs(t, err, opensandbox.ErrMalformed, "Wait error")
	})
	t.Run("CreateAnswer", func(t *testing.T) {
		// The create took effect but its answer is garbage: Start finds the sandbox by its
		// instance id.
		f.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Malformed: true})
		h, err := b.Start(ctxT(t), spec(702, opensandboxtest.ScriptRun))
		require.NoError(t, err, "Start")
		t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
		assert.Equal(t, 1, countTask(f, "702"), "sandboxes of the task")
	})
}

func TestInvalidInput(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	for _, tt := range []struct {
		name string
		mod  func(*podworker.Spec)
	}{
		{name: "no token", mod: func(s *podworker.Spec) { s.Files = nil }},
		{name: "empty token", mod: func(s *podworker.Spec) { s.Files[podworker.TokenFile] = nil }},
		{name: "token in env", mod: func(s *podworker.Spec) { s.Env["LEAK"] = "x" + testToken }},
		{name: "token and JIT configuration", mod: func(s *podworker.Spec) { s.Files[executor.JITConfigFile] = []byte(testJIT) }},
		{name: "empty JIT configuration", mod: func(s *podworker.Spec) {
			s.Files = map[string][]byte{executor.JITConfigFile: nil}
		}},
		{name: "JIT configuration in env", mod: func(s *podworker.Spec) {
			s.Files = map[string][]byte{executor.JITConfigFile: []byte(testJIT)}
			s.Env["LEAK"] = testJIT + "x"
		}},
		{name: "no epoch", mod: func(s *podworker.Spec) { s.Epoch = 0 }},
		{name: "bad env name", mod: func(s *podworker.Spec) { s.Env["A=B"] = "x" }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sp := spec(801, opensandboxtest.ScriptRun)
			tt.mod(&sp)
			_, err := b.Start(ctxT(t), sp)
			f.checkErr(t, err)
			assert.ErrorIs(t, err, opensandbox.ErrInvalidSpec, "Start error")
		})
	}
	assert.Empty(t, f.srv.Requests(), "invalid specs sent requests")
	for _, h := range []podworker.Handle{
		{Backend: "docker", ID: "abc"},
		{Backend: b.Name(), ID: "../escape"},
		{Backend: b.Name(), ID: ""},
	} {
		assert.ErrorIs(t, b.Destroy(ctxT(t), h), opensandbox.ErrInvalidHandle, "Destroy(%+v)", h)
		_, err := b.Wait(ctxT(t), h)
		assert.ErrorIs(t, err, opensandbox.ErrInvalidHandle, "Wait(%+v)", h)
	}
}

func TestNonceIssueFails(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	// JetStream loses the nonce bucket: Issue fails, and Start with it before any create.
	require.NoError(t, f.js.DeleteKeyValue(t.Context(), eventlog.BucketNonces))
	_, err := b.Start(ctxT(t), spec(901, opensandboxtest.ScriptRun))
	f.checkErr(t, err)
	assert.ErrorContains(t, err, "issue nonce")
	assert.Zero(t, f.count(http.MethodPost, "/sandboxes"), "creates without a nonce")
}

func TestStartReplacesEndedSandbox(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	sp := spec(1001, opensandboxtest.ScriptRun)
	h1, err := b.Start(ctxT(t), sp)
	require.NoError(t, err, "Start")
	f.srv.SetState(h1.ID, opensandbox.StateFailed, "runtime_error", "node lost")
	h2, err := b.Start(ctxT(t), sp)
	require.NoError(t, err, "second Start")
	t.Cleanup(func() { _ = b.Destroy(context.Background(), h2) })
	assert.NotEqual(t, h1.ID, h2.ID, "second Start returned the failed sandbox")
	_, ok := f.srv.Sandbox(h1.ID)
	assert.False(t, ok, "the failed sandbox %s was not deleted", h1.ID)
}

func TestWaitReportsFailure(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	h, err := b.Start(ctxT(t), spec(1101, opensandboxtest.ScriptRun))
	require.NoError(t, err, "Start")
	t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
	f.srv.SetState(h.ID, opensandbox.StateFailed, "runtime_error", "the microVM crashed")
	exit, err := b.Wait(ctxT(t), h)
	require.NoError(t, err, "Wait")
	assert.Equal(t, podworker.Exit{Code: -1, Reason: "sandbox failed (runtime_error: the microVM crashed)"}, exit, "exit")
	f.srv.SetAuthStatus(http.StatusUnauthorized)
	defer f.srv.SetAuthStatus(0)
	_, err = b.Wait(ctxT(t), h)
	f.checkErr(t, err)
	assert.ErrorIs(t, err, opensandbox.ErrUnauthorized, "Wait with a refused key")
}
