package opensandbox_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
	"github.com/dynrunner/dynrunner/vmworker"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox/opensandboxtest"
)

// testEndpoint is the nonce endpoint URL the tests give sandboxes.
const testEndpoint = "http://10.213.0.1:7001"

// testImage is the image the tests send.
const testImage = "registry.example/dynrunner/ci-vm@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// fixture is a fake OpenSandbox server, a nonce store and a log, with backends over them.
type fixture struct {
	srv    *opensandboxtest.Server
	nonces *vmworker.Nonces
	js     jetstream.JetStream
	logs   *syncBuffer
	cfg    opensandbox.Config
}

func newFixture(t *testing.T, scfg opensandboxtest.ServerConfig) *fixture {
	t.Helper()
	f := &fixture{srv: opensandboxtest.NewServer(t, scfg), logs: &syncBuffer{}}
	f.nonces, f.js = opensandbox.NewTestNonces(t)
	f.cfg = opensandbox.Config{
		BaseURL:      f.srv.URL,
		APIKey:       []byte(f.srv.APIKey() + "\n"), // as read from a key file
		Image:        testImage,
		Nonces:       f.nonces,
		Endpoint:     testEndpoint,
		Timeout:      2 * time.Second,
		StartTimeout: time.Second,
		PollInterval: 5 * time.Millisecond,
		RetryBase:    5 * time.Millisecond,
		RetryMax:     20 * time.Millisecond,
		Log:          zerolog.New(f.logs),
	}
	t.Cleanup(func() {
		assert.NotContains(t, f.logs.String(), f.srv.APIKey(), "the API key is in the log")
		for _, r := range f.srv.Requests() {
			assert.NotContains(t, string(r.Body), podworkertest.TokenPrefix, "a capability token was sent to OpenSandbox: %s %s", r.Method, r.Path)
			assert.NotContains(t, string(r.Body), testToken, "a capability token was sent to OpenSandbox: %s %s", r.Method, r.Path)
		}
	})
	return f
}

// backend returns a backend over the fixture, with cfg changed by mod.
func (f *fixture) backend(t *testing.T, mod func(*opensandbox.Config)) *opensandbox.Backend {
	t.Helper()
	cfg := f.cfg
	if mod != nil {
		mod(&cfg)
	}
	b, err := opensandbox.New(cfg)
	require.NoError(t, err, "New")
	return b
}

// testToken is the capability token of spec; testJIT the JIT configuration of githubSpec.
const (
	testToken = "dynrunner-capability-token-never-leaves"
	testJIT   = "eyJkeW5ydW5uZXIiOiJKSVQgY29uZmlndXJhdGlvbiJ9"
)

// githubSpec returns the spec of GitHub slot task whose sandbox runs script: its credential is
// a JIT configuration, not a capability token.
func githubSpec(task assignment.TaskID, script opensandboxtest.Script) podworker.Spec {
	s := spec(task, script)
	s.Env["DYNRUNNER_FORGE"] = "github"
	s.Files = map[string][]byte{executor.JITConfigFile: []byte(testJIT)}
	return s
}

// spec returns a spec for task whose sandbox runs script.
func spec(task assignment.TaskID, script opensandboxtest.Script) podworker.Spec {
	return podworker.Spec{
		Task: task, Epoch: 7,
		Env:   map[string]string{opensandboxtest.ScriptEnv: string(script), "DYNRUNNER_TASK_ID": task.String(), "DYNRUNNER_EPOCH": "7"},
		Files: map[string][]byte{podworker.TokenFile: []byte(testToken)},
	}
}

// checkErr fails t if err is nil or mentions the API key.
func (f *fixture) checkErr(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	assert.NotContains(t, err.Error(), f.srv.APIKey(), "the error holds the API key")
	assert.NotContains(t, err.Error(), testToken, "the error holds the capability token")
	assert.NotContains(t, err.Error(), testJIT, "the error holds the JIT configuration")
	t.Logf("error: %v", err)
}

// issued returns how many nonces were issued.
func (f *fixture) issued(t *testing.T) uint64 {
	t.Helper()
	kv, err := f.js.KeyValue(t.Context(), eventlog.BucketNonces)
	require.NoError(t, err)
	st, err := kv.Status(t.Context())
	require.NoError(t, err)
	return st.Values()
}

// redeem redeems nonce for instance, as the nonce endpoint does.
func (f *fixture) redeem(t *testing.T, instance, nonce string) (assignment.TaskID, assignment.Epoch, vmworker.Credential, error) {
	t.Helper()
	return f.nonces.Redeem(t.Context(), instance, nonce)
}

// count returns how many requests with method and a path ending in suffix the server got.
func (f *fixture) count(method, suffix string) int {
	n := 0
	for _, r := range f.srv.Requests() {
		if r.Method == method && strings.HasSuffix(r.Path, suffix) {
			n++
		}
	}
	return n
}

// poll calls cond until it is true or timeout passed.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
