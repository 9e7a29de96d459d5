package opensandbox_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
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
	require.NoError(t, err, "Start")
	t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })

	var creates []opensandboxtest.Request
	for _, r := range f.srv.Requests() {
		assert.Equal(t, f.srv.APIKey(), r.APIKey, "%s %s: %s header, want the key without the file's newline", r.Method, r.Path, opensandboxtest.APIKeyHeader)
		assert.True(t, strings.HasPrefix(r.Path, "/v1/sandboxes"), "request to %s, want the API's /v1/sandboxes paths", r.Path)
		if r.Method == http.MethodPost {
			creates = append(creates, r)
		}
	}
	require.Len(t, creates, 1, "creates")
	var body map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(creates[0].Body, &body), "create body")
	var keys []string
	for k := range body {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	assert.Equal(t, []string{"entrypoint", "env", "extensions", "image", "metadata", "resourceLimits", "timeout"}, keys, "create body fields")

	sb, ok := f.srv.Sandbox(h.ID)
	require.True(t, ok, "sandbox %s not on the server", h.ID)
	assert.Equal(t, map[string]string{"poolRef": "ci-vm"}, sb.Extensions, "extensions")
	assert.Equal(t, int(opensandbox.DefaultSandboxTTL.Seconds()), sb.Timeout, "timeout, want %v in seconds", opensandbox.DefaultSandboxTTL)
	assert.Equal(t, opensandbox.DefaultEntrypoint, sb.Entrypoint, "entrypoint")
	assert.Equal(t, testImage, sb.Image, "image")
	assert.Equal(t, opensandbox.DefaultResources, sb.ResourceLimits, "resourceLimits")
	instance := sb.Env[opensandbox.EnvInstanceID]
	u, err := uuid.Parse(instance)
	if assert.NoError(t, err, "instance id %q", instance) {
		assert.Equal(t, instance, u.String(), "instance id: want a UUID in canonical form")
		assert.Equal(t, uuid.Version(4), u.Version(), "instance id %q: UUID version", instance)
		assert.Equal(t, uuid.RFC4122, u.Variant(), "instance id %q: UUID variant", instance)
	}
	assert.Equal(t, instance, h.Data[opensandbox.DataInstanceID], "handle instance id: want the same UUID")
	assert.Equal(t, testEndpoint, sb.Env[opensandbox.EnvEndpoint], "env endpoint")
	assert.GreaterOrEqual(t, len(sb.Env[opensandbox.EnvNonce]), 32, "env nonce bytes: want a nonce")
	for k, v := range sp.Env {
		assert.Equal(t, v, sb.Env[k], "env %s, want the spec's", k)
	}
	assert.Len(t, sb.Env, len(sp.Env)+3, "env: want the spec's and the three guest variables, nothing else")
	wantMeta := map[string]string{
		opensandbox.MetaManagedBy: "dynrunner", opensandbox.MetaScope: opensandbox.DefaultScope,
		opensandbox.MetaTask: "42", opensandbox.MetaEpoch: "7", opensandbox.MetaInstanceID: instance,
		opensandbox.MetaPool: "ci-vm", "name": "dynrunner-42-7",
	}
	for k, v := range wantMeta {
		assert.Equal(t, v, sb.Metadata[k], "metadata %s", k)
	}
	assert.NotEmpty(t, sb.Metadata[opensandbox.MetaCreated], "metadata lacks %s", opensandbox.MetaCreated)
	assert.Equal(t, map[string]string{opensandbox.DataInstanceID: instance, opensandbox.DataPool: "ci-vm"}, h.Data, "handle data")
	// The nonce redeems once for the token, for this instance only.
	_, _, _, err = f.redeem(t, "00000000-0000-4000-8000-000000000000", sb.Env[opensandbox.EnvNonce])
	assert.ErrorIs(t, err, vmworker.ErrUnknownNonce, "the nonce redeemed for another instance")
	task, epoch, cred, err := f.redeem(t, instance, sb.Env[opensandbox.EnvNonce])
	require.NoError(t, err, "Redeem")
	assert.Equal(t, assignment.TaskID(42), task)
	assert.Equal(t, assignment.Epoch(7), epoch)
	assert.Equal(t, vmworker.Credential{Token: testToken}, cred, "the redeemed token")
	_, _, _, err = f.redeem(t, instance, sb.Env[opensandbox.EnvNonce])
	assert.ErrorIs(t, err, vmworker.ErrNonceRedeemed, "the nonce redeemed twice")
}

func TestPoolOnly(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, func(c *opensandbox.Config) { c.Image = ""; c.Pool = "gpu-vm" })
	h, err := b.Start(ctxT(t), spec(43, opensandboxtest.ScriptRun))
	require.NoError(t, err, "Start without an image")
	t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
	sb, _ := f.srv.Sandbox(h.ID)
	assert.Empty(t, sb.Image, "image: want none")
	assert.Equal(t, "gpu-vm", sb.Extensions["poolRef"], "poolRef")
	assert.Equal(t, "gpu-vm", h.Data[opensandbox.DataPool], "handle pool")
}

func TestBaseURLWithoutVersion(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	for _, base := range []string{f.srv.RootURL, f.srv.RootURL + "/"} {
		b := f.backend(t, func(c *opensandbox.Config) { c.BaseURL = base })
		_, err := b.List(ctxT(t))
		require.NoError(t, err, "List with base %s", base)
	}
	for _, r := range f.srv.Requests() {
		assert.Equal(t, "/v1/sandboxes", r.Path, "request path")
	}
}

func TestListScopeAndQuery(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	a := f.backend(t, func(c *opensandbox.Config) { c.Scope = "staging" })
	b := f.backend(t, nil)
	ha, err := a.Start(ctxT(t), spec(51, opensandboxtest.ScriptRun))
	require.NoError(t, err, "Start")
	t.Cleanup(func() { _ = a.Destroy(context.Background(), ha) })
	hb, err := b.Start(ctxT(t), spec(51, opensandboxtest.ScriptRun))
	require.NoError(t, err, "Start")
	t.Cleanup(func() { _ = b.Destroy(context.Background(), hb) })
	require.NotEqual(t, ha.ID, hb.ID, "two scopes share a sandbox")
	for _, tt := range []struct {
		b    *opensandbox.Backend
		want string
	}{{a, ha.ID}, {b, hb.ID}} {
		hs, err := tt.b.List(ctxT(t))
		require.NoError(t, err, "List")
		if assert.Len(t, hs, 1, "List, want only %s", tt.want) {
			assert.Equal(t, tt.want, hs[0].ID, "List")
		}
	}
	// The metadata parameter is "k=v&k=v", encoded once more, as the API documents.
	for _, r := range f.srv.Requests() {
		if r.Method != http.MethodGet || r.Path != "/v1/sandboxes" {
			continue
		}
		q, err := url.ParseQuery(r.RawQuery)
		require.NoError(t, err, "query %q", r.RawQuery)
		inner, err := url.ParseQuery(q.Get("metadata"))
		assert.NoError(t, err, "metadata filter %q", q.Get("metadata"))
		assert.Equal(t, "dynrunner", inner.Get(opensandbox.MetaManagedBy), "metadata filter %q: want managed-by", q.Get("metadata"))
		assert.NotEmpty(t, inner.Get(opensandbox.MetaScope), "metadata filter %q: want scope", q.Get("metadata"))
		assert.NotEmpty(t, q.Get("page"), "list query %q lacks page", r.RawQuery)
		assert.NotEmpty(t, q.Get("pageSize"), "list query %q lacks pageSize", r.RawQuery)
	}
}

func TestListPages(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	const n = 230 // three pages of 100
	for i := range n {
		_, err := b.Start(ctxT(t), spec(60_000+assignmentTask(i), opensandboxtest.ScriptRun))
		require.NoError(t, err, "Start %d", i)
	}
	hs, err := b.List(ctxT(t))
	require.NoError(t, err, "List")
	assert.Len(t, hs, n, "List handles")
	for _, h := range hs {
		require.NoError(t, b.Destroy(ctxT(t), h), "Destroy")
	}
}

// TestSecretsStayOut checks that neither the API key (even echoed by the server), the nonce nor
// the token reach an error or the log.
func TestSecretsStayOut(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	h, err := b.Start(ctxT(t), spec(71, opensandboxtest.ScriptRun))
	require.NoError(t, err, "Start")
	sb, _ := f.srv.Sandbox(h.ID)
	nonce := sb.Env[opensandbox.EnvNonce]

	key := f.srv.APIKey()
	f.srv.Inject(opensandboxtest.Fault{Status: http.StatusInternalServerError, Count: 100,
		Code: "ECHO", Message: "your key " + key + " and again " + key[:len(key)-3]})
	_, err = b.List(ctxT(t))
	f.checkErr(t, err)
	assert.ErrorContains(t, err, "[redacted]", "want the echoed key redacted")
	f.srv.ClearFaults()
	require.NoError(t, b.Destroy(ctxT(t), h), "Destroy")
	logs := f.logs.String()
	for what, secret := range map[string]string{"API key": key, "nonce": nonce, "token": testToken} {
		assert.False(t, strings.Contains(logs, secret), "the %s is in the log", what)
	}
	assert.Contains(t, logs, "sandbox created", "the log lacks the creation")
	assert.Contains(t, logs, `"task_id":71`, "the log lacks the creation's task id")
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
	assert.ErrorIs(t, err, opensandbox.ErrRejected, "Start error")
	var body struct{ Env map[string]string }
	for _, r := range f.srv.Requests() {
		if r.Method == http.MethodPost {
			require.NoError(t, json.Unmarshal(r.Body, &body))
		}
	}
	nonce := body.Env[opensandbox.EnvNonce]
	require.NotEmpty(t, nonce, "no nonce was sent")
	assert.NotContains(t, err.Error(), nonce, "the error holds the nonce")
	assert.ErrorContains(t, err, `"DYNRUNNER_NONCE":"[redacted]"`, "want the echoed nonce redacted")
	assert.False(t, strings.Contains(f.logs.String(), nonce), "the log holds the nonce")
}

func TestWrongBaseURL(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, func(c *opensandbox.Config) { c.BaseURL = f.srv.RootURL + "/api" })
	_, err := b.List(ctxT(t))
	f.checkErr(t, err)
	assert.ErrorIs(t, err, opensandbox.ErrRejected, "List error")
	assert.NotErrorIs(t, err, podworker.ErrNotFound, "List error")
	assert.ErrorContains(t, err, "server URL", "the error does not point at the server URL")
}

// TestGitHubSlotSandbox: a GitHub slot's sandbox is created like a Gitea assignment's; its
// nonce redeems, once, for the slot's JIT configuration, which is in no request the backend
// sent.
func TestGitHubSlotSandbox(t *testing.T) {
	f := newFixture(t, opensandboxtest.ServerConfig{})
	b := f.backend(t, nil)
	task := assignment.SlotBase + 44
	h, err := b.Start(ctxT(t), githubSpec(task, opensandboxtest.ScriptRun))
	require.NoError(t, err, "Start")
	t.Cleanup(func() { _ = b.Destroy(context.Background(), h) })
	for _, r := range f.srv.Requests() {
		assert.NotContains(t, string(r.Body), testJIT, "%s %s sent the JIT configuration", r.Method, r.Path)
		assert.NotContains(t, r.Path+"?"+r.RawQuery, testJIT, "%s %s sent the JIT configuration", r.Method, r.Path)
	}
	sb, ok := f.srv.Sandbox(h.ID)
	require.True(t, ok, "sandbox %s not on the server", h.ID)
	assert.Equal(t, "github", sb.Env["DYNRUNNER_FORGE"])
	assert.Equal(t, task.String(), sb.Metadata[opensandbox.MetaTask])
	got, epoch, cred, err := f.redeem(t, sb.Env[opensandbox.EnvInstanceID], sb.Env[opensandbox.EnvNonce])
	require.NoError(t, err, "Redeem")
	assert.Equal(t, task, got)
	assert.Equal(t, assignment.Epoch(7), epoch)
	assert.Equal(t, vmworker.Credential{JITConfig: testJIT}, cred, "the redeemed credential")
	_, _, _, err = f.redeem(t, sb.Env[opensandbox.EnvInstanceID], sb.Env[opensandbox.EnvNonce])
	assert.ErrorIs(t, err, vmworker.ErrNonceRedeemed, "the nonce redeemed twice")
}
