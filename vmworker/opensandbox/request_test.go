package opensandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/vmworker"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox/opensandboxtest"
)

// TestCreateRequest checks the create request against the published schema and what the
// sandbox receives.
func TestCreateRequest(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	sp := spec(42, opensandboxtest.ScriptRun)
	h, err := b.Start(ctxT(t), sp)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })

	var creates []opensandboxtest.Request
	for _, r := range f.srv.Requests() {
		if got := r.APIKey; got != f.srv.APIKey() {
			t.Errorf("%s %s: %s header = %q, want the key without the file's newline", r.Method, r.Path, opensandboxtest.APIKeyHeader, got)
		}
		if !strings.HasPrefix(r.Path, "/v1/sandboxes") {
			t.Errorf("request to %s, want the API's /v1/sandboxes paths", r.Path)
		}
		if r.Method == http.MethodPost {
			creates = append(creates, r)
		}
	}
	if len(creates) != 1 {
		t.Fatalf("%d creates, want 1", len(creates))
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(creates[0].Body, &body); err != nil {
		t.Fatalf("create body: %v", err)
	}
	var keys []string
	for k := range body {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"entrypoint", "env", "extensions", "image", "metadata", "resourceLimits", "timeout"}; !slices.Equal(keys, want) {
		t.Errorf("create body fields %v, want %v", keys, want)
	}

	sb, ok := f.srv.Sandbox(h.ID)
	if !ok {
		t.Fatalf("sandbox %s not on the server", h.ID)
	}
	if want := map[string]string{"poolRef": "ci-vm"}; !reflect.DeepEqual(sb.Extensions, want) {
		t.Errorf("extensions = %v, want %v", sb.Extensions, want)
	}
	if sb.Timeout != int(opensandbox.DefaultSandboxTTL.Seconds()) {
		t.Errorf("timeout = %d, want %v in seconds", sb.Timeout, opensandbox.DefaultSandboxTTL)
	}
	if !slices.Equal(sb.Entrypoint, opensandbox.DefaultEntrypoint) || sb.Image != testImage {
		t.Errorf("entrypoint %q image %q, want %q %q", sb.Entrypoint, sb.Image, opensandbox.DefaultEntrypoint, testImage)
	}
	if !reflect.DeepEqual(sb.ResourceLimits, opensandbox.DefaultResources) {
		t.Errorf("resourceLimits = %v, want %v", sb.ResourceLimits, opensandbox.DefaultResources)
	}
	instance := sb.Env[opensandbox.EnvInstanceID]
	if u, err := uuid.Parse(instance); err != nil || u.String() != instance || u.Version() != 4 || u.Variant() != uuid.RFC4122 ||
		h.Data[opensandbox.DataInstanceID] != instance {
		t.Errorf("instance id %q (handle %q): want the same UUID", instance, h.Data[opensandbox.DataInstanceID])
	}
	if sb.Env[opensandbox.EnvEndpoint] != testEndpoint || len(sb.Env[opensandbox.EnvNonce]) < 32 {
		t.Errorf("env endpoint %q nonce of %d bytes: want %q and a nonce", sb.Env[opensandbox.EnvEndpoint], len(sb.Env[opensandbox.EnvNonce]), testEndpoint)
	}
	for k, v := range sp.Env {
		if sb.Env[k] != v {
			t.Errorf("env %s = %q, want the spec's %q", k, sb.Env[k], v)
		}
	}
	if len(sb.Env) != len(sp.Env)+3 {
		t.Errorf("env = %v: want the spec's and the three guest variables, nothing else", sb.Env)
	}
	wantMeta := map[string]string{
		opensandbox.MetaManagedBy: "dynrunner", opensandbox.MetaScope: opensandbox.DefaultScope,
		opensandbox.MetaTask: "42", opensandbox.MetaEpoch: "7", opensandbox.MetaInstanceID: instance,
		opensandbox.MetaPool: "ci-vm", "name": "dynrunner-42-7",
	}
	for k, v := range wantMeta {
		if sb.Metadata[k] != v {
			t.Errorf("metadata %s = %q, want %q", k, sb.Metadata[k], v)
		}
	}
	if sb.Metadata[opensandbox.MetaCreated] == "" {
		t.Errorf("metadata lacks %s", opensandbox.MetaCreated)
	}
	assert.Equal(t, map[string]string{opensandbox.DataInstanceID: instance, opensandbox.DataPool: "ci-vm"}, h.Data, "handle data")
	// The nonce redeems once for the token, for this instance only.
	_, _, _, err = f.redeem(t, "00000000-0000-4000-8000-000000000000", sb.Env[opensandbox.EnvNonce])
	assert.ErrorIs(t, err, vmworker.ErrUnknownNonce, "the nonce redeemed for another instance")
	task, epoch, token, err := f.redeem(t, instance, sb.Env[opensandbox.EnvNonce])
	require.NoError(t, err, "Redeem")
	assert.Equal(t, assignment.TaskID(42), task)
	assert.Equal(t, assignment.Epoch(7), epoch)
	assert.Equal(t, testToken, token, "the redeemed token")
	_, _, _, err = f.redeem(t, instance, sb.Env[opensandbox.EnvNonce])
	assert.ErrorIs(t, err, vmworker.ErrNonceRedeemed, "the nonce redeemed twice")
}

func TestPoolOnly(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, func(c *opensandbox.Config) { c.Image = ""; c.Pool = "gpu-vm" })
	h, err := b.Start(ctxT(t), spec(43, opensandboxtest.ScriptRun))
	if err != nil {
		t.Fatalf("Start without an image: %v", err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
	sb, _ := f.srv.Sandbox(h.ID)
	if sb.Image != "" || sb.Extensions["poolRef"] != "gpu-vm" || h.Data[opensandbox.DataPool] != "gpu-vm" {
		t.Errorf("image %q poolRef %q handle pool %q: want no image and pool gpu-vm", sb.Image, sb.Extensions["poolRef"], h.Data[opensandbox.DataPool])
	}
}

func TestBaseURLWithoutVersion(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	for _, base := range []string{f.srv.RootURL, f.srv.RootURL + "/"} {
		b := f.backend(t, func(c *opensandbox.Config) { c.BaseURL = base })
		if _, err := b.List(ctxT(t)); err != nil {
			t.Fatalf("List with base %s: %v", base, err)
		}
	}
	for _, r := range f.srv.Requests() {
		if r.Path != "/v1/sandboxes" {
			t.Errorf("request to %s, want /v1/sandboxes", r.Path)
		}
	}
}

func TestListScopeAndQuery(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	a := f.backend(t, func(c *opensandbox.Config) { c.Scope = "staging" })
	b := f.backend(t, nil)
	ha, err := a.Start(ctxT(t), spec(51, opensandboxtest.ScriptRun))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = a.Destroy(context.Background(), ha) })
	hb, err := b.Start(ctxT(t), spec(51, opensandboxtest.ScriptRun))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = b.Destroy(context.Background(), hb) })
	if ha.ID == hb.ID {
		t.Fatalf("two scopes share sandbox %s", ha.ID)
	}
	for _, tt := range []struct {
		b    *opensandbox.Backend
		want string
	}{{a, ha.ID}, {b, hb.ID}} {
		hs, err := tt.b.List(ctxT(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(hs) != 1 || hs[0].ID != tt.want {
			t.Errorf("List = %+v, want only %s", hs, tt.want)
		}
	}
	// The metadata parameter is "k=v&k=v", encoded once more, as the API documents.
	for _, r := range f.srv.Requests() {
		if r.Method != http.MethodGet || r.Path != "/v1/sandboxes" {
			continue
		}
		q, err := url.ParseQuery(r.RawQuery)
		if err != nil {
			t.Fatalf("query %q: %v", r.RawQuery, err)
		}
		inner, err := url.ParseQuery(q.Get("metadata"))
		if err != nil || inner.Get(opensandbox.MetaManagedBy) != "dynrunner" || inner.Get(opensandbox.MetaScope) == "" {
			t.Errorf("metadata filter %q: want managed-by and scope", q.Get("metadata"))
		}
		if q.Get("page") == "" || q.Get("pageSize") == "" {
			t.Errorf("list query %q lacks page and pageSize", r.RawQuery)
		}
	}
}

func TestListPages(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	const n = 230 // three pages of 100
	for i := range n {
		if _, err := b.Start(ctxT(t), spec(60_000+assignmentTask(i), opensandboxtest.ScriptRun)); err != nil {
			t.Fatalf("Start %d: %v", i, err)
		}
	}
	hs, err := b.List(ctxT(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(hs) != n {
		t.Errorf("List = %d handles, want %d", len(hs), n)
	}
	for _, h := range hs {
		if err := b.Destroy(ctxT(t), h); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
	}
}

// TestSecretsStayOut checks that neither the API key (even echoed by the server), the nonce nor
// the token reach an error or the log.
func TestSecretsStayOut(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	h, err := b.Start(ctxT(t), spec(71, opensandboxtest.ScriptRun))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	sb, _ := f.srv.Sandbox(h.ID)
	nonce := sb.Env[opensandbox.EnvNonce]

	key := f.srv.APIKey()
	f.srv.Inject(opensandboxtest.Fault{Status: http.StatusInternalServerError, Count: 100,
		Code: "ECHO", Message: "your key " + key + " and again " + key[:len(key)-3]})
	_, err = b.List(ctxT(t))
	f.checkErr(t, err)
	if !strings.Contains(err.Error(), "[redacted]") {
		t.Errorf("error %q: want the echoed key redacted", err)
	}
	f.srv.ClearFaults()
	if err := b.Destroy(ctxT(t), h); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	logs := f.logs.String()
	for what, secret := range map[string]string{"API key": key, "nonce": nonce, "token": testToken} {
		if strings.Contains(logs, secret) {
			t.Errorf("the %s is in the log", what)
		}
	}
	if !strings.Contains(logs, "sandbox created") || !bytes.Contains([]byte(logs), []byte(`"task_id":71`)) {
		t.Errorf("the log lacks the creation with its task id:\n%s", logs)
	}
}

// TestEchoedBody checks that a server quoting the create request in its error (as validation
// errors do) does not bring the nonce into the error.
func TestEchoedBody(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	// Without an image the nonce falls within the part of the message errors keep.
	b := f.backend(t, func(c *opensandbox.Config) { c.Image = "" })
	f.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Status: http.StatusUnprocessableEntity, EchoBody: true})
	_, err := b.Start(ctxT(t), spec(81, opensandboxtest.ScriptRun))
	f.checkErr(t, err)
	if !errors.Is(err, opensandbox.ErrRejected) {
		t.Errorf("Start error = %v, want ErrRejected", err)
	}
	var body struct{ Env map[string]string }
	for _, r := range f.srv.Requests() {
		if r.Method == http.MethodPost {
			if err := json.Unmarshal(r.Body, &body); err != nil {
				t.Fatal(err)
			}
		}
	}
	nonce := body.Env[opensandbox.EnvNonce]
	if nonce == "" || strings.Contains(err.Error(), nonce) {
		t.Errorf("the error holds the nonce %q (or none was sent): %v", nonce, err)
	}
	if !strings.Contains(err.Error(), `"DYNRUNNER_NONCE":"[redacted]"`) {
		t.Errorf("error %q: want the echoed nonce redacted", err)
	}
	if strings.Contains(f.logs.String(), nonce) {
		t.Errorf("the log holds the nonce")
	}
}

func TestWrongBaseURL(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, func(c *opensandbox.Config) { c.BaseURL = f.srv.RootURL + "/api" })
	_, err := b.List(ctxT(t))
	f.checkErr(t, err)
	if !errors.Is(err, opensandbox.ErrRejected) || errors.Is(err, podworker.ErrNotFound) {
		t.Errorf("List error = %v, want ErrRejected, not ErrNotFound", err)
	}
	if !strings.Contains(err.Error(), "server URL") {
		t.Errorf("error %q does not point at the server URL", err)
	}
}
