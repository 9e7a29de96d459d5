package opensandbox_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox"
	"github.com/dynrunner/dynrunner/vmworker/vmworkertest"
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
	srv    *vmworkertest.Server
	nonces *vmworkertest.Nonces
	logs   *syncBuffer
	cfg    opensandbox.Config
}

func newFixture(t *testing.T, scfg vmworkertest.ServerConfig) *fixture {
	t.Helper()
	f := &fixture{srv: vmworkertest.NewServer(t, scfg), nonces: vmworkertest.NewNonces(), logs: &syncBuffer{}}
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
		logs := f.logs.String()
		if strings.Contains(logs, f.srv.APIKey()) {
			t.Errorf("the API key is in the log:\n%s", logs)
		}
		for _, r := range f.srv.Requests() {
			if bytes.Contains(r.Body, []byte("vmworkertest-token-")) || bytes.Contains(r.Body, []byte(testToken)) {
				t.Errorf("a capability token was sent to OpenSandbox: %s %s %s", r.Method, r.Path, r.Body)
			}
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
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

// testToken is the capability token of spec.
const testToken = "dynrunner-capability-token-never-leaves"

// spec returns a spec for task whose sandbox runs script.
func spec(task assignment.TaskID, script vmworkertest.Script) podworker.Spec {
	return podworker.Spec{
		Task: task, Epoch: 7,
		Env:   map[string]string{vmworkertest.ScriptEnv: string(script), "DYNRUNNER_TASK_ID": task.String(), "DYNRUNNER_EPOCH": "7"},
		Files: map[string][]byte{podworker.TokenFile: []byte(testToken)},
	}
}

// checkErr fails t if err is nil or mentions the API key.
func (f *fixture) checkErr(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("got no error")
	}
	if strings.Contains(err.Error(), f.srv.APIKey()) {
		t.Errorf("the error holds the API key: %v", err)
	}
	if strings.Contains(err.Error(), testToken) {
		t.Errorf("the error holds the capability token: %v", err)
	}
	t.Logf("error: %v", err)
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
