package opensandboxtest_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/vmworker/opensandbox/opensandboxtest"
)

// call sends one raw request and returns the status, headers and decoded JSON body.
func call(t *testing.T, srv *opensandboxtest.Server, method, path, key string, body any) (int, http.Header, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, rd)
	require.NoError(t, err)
	if key != "" {
		req.Header.Set(opensandboxtest.APIKeyHeader, key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(data) > 0 {
		require.NoError(t, json.Unmarshal(data, &out), "%s %s: answer %q is not JSON", method, path, data)
	}
	assert.NotEmpty(t, resp.Header.Get("X-Request-ID"), "%s %s: no X-Request-ID", method, path)
	return resp.StatusCode, resp.Header, out
}

func createBody(metadata map[string]string) map[string]any {
	return map[string]any{
		"image": map[string]string{"uri": "python:3.11"}, "timeout": 3600,
		"resourceLimits": map[string]string{"cpu": "500m", "memory": "512Mi"},
		"entrypoint":     []string{"python", "/app/main.py"}, "metadata": metadata,
	}
}

func TestServerSpeaksTheAPI(t *testing.T) {
	srv := opensandboxtest.NewServer(t, opensandboxtest.ServerConfig{})
	key := srv.APIKey()

	status, _, body := call(t, srv, http.MethodGet, "/sandboxes", "", nil)
	assert.Equal(t, http.StatusUnauthorized, status, "no key")
	assert.Equal(t, "MISSING_API_KEY", body["code"], "no key")
	status, _, body = call(t, srv, http.MethodGet, "/sandboxes", "wrong", nil)
	assert.Equal(t, http.StatusUnauthorized, status, "wrong key")
	assert.Equal(t, "INVALID_API_KEY", body["code"], "wrong key")
	assert.NotNil(t, body["message"], "wrong key: the answer has a message")

	status, hdr, body := call(t, srv, http.MethodPost, "/sandboxes", key, createBody(map[string]string{"project": "apollo"}))
	require.Equal(t, http.StatusAccepted, status, "create: %v", body)
	id, _ := body["id"].(string)
	assert.NotEmpty(t, id, "create answer: an id")
	assert.NotEmpty(t, hdr.Get("Location"), "create answer: a Location")
	assert.Nil(t, body["image"], "create answer: no image")
	for _, field := range []string{"status", "createdAt", "expiresAt", "entrypoint", "metadata"} {
		assert.NotNil(t, body[field], "create answer lacks %s: %v", field, body)
	}
	st, _ := body["status"].(map[string]any)
	assert.Equal(t, "Pending", st["state"], "create answer state")
	status, _, body = call(t, srv, http.MethodGet, "/sandboxes/"+id, key, nil)
	st, _ = body["status"].(map[string]any)
	assert.Equal(t, http.StatusOK, status, "get")
	assert.Equal(t, "Running", st["state"], "get: state")
	assert.NotNil(t, body["image"], "get: with the image")

	for i := range 2 {
		status, _, body := call(t, srv, http.MethodPost, "/sandboxes", key, createBody(map[string]string{"project": "other", "n": string(rune('a' + i))}))
		require.Equal(t, http.StatusAccepted, status, "create: %v", body)
	}
	filter := url.Values{"metadata": {url.Values{"project": {"other"}}.Encode()}, "pageSize": {"1"}}
	status, _, body = call(t, srv, http.MethodGet, "/sandboxes?"+filter.Encode(), key, nil)
	pg, _ := body["pagination"].(map[string]any)
	items, _ := body["items"].([]any)
	assert.Equal(t, http.StatusOK, status, "list page 1")
	assert.Len(t, items, 1, "list page 1: items")
	assert.Equal(t, map[string]any{"totalItems": 2.0, "hasNextPage": true, "totalPages": 2.0},
		map[string]any{"totalItems": pg["totalItems"], "hasNextPage": pg["hasNextPage"], "totalPages": pg["totalPages"]}, "list page 1: pagination")
	filter.Set("page", "2")
	_, _, body = call(t, srv, http.MethodGet, "/sandboxes?"+filter.Encode(), key, nil)
	pg, _ = body["pagination"].(map[string]any)
	assert.Equal(t, false, pg["hasNextPage"], "list page 2: %v", body)
	status, _, _ = call(t, srv, http.MethodGet, "/sandboxes?metadata=broken", key, nil)
	assert.Equal(t, http.StatusBadRequest, status, "malformed metadata filter")

	status, _, _ = call(t, srv, http.MethodDelete, "/sandboxes/"+id, key, nil)
	assert.Equal(t, http.StatusNoContent, status, "delete")
	status, _, body = call(t, srv, http.MethodDelete, "/sandboxes/"+id, key, nil)
	assert.Equal(t, http.StatusNotFound, status, "second delete")
	assert.NotNil(t, body["code"], "second delete: an ErrorResponse")
	status, _, _ = call(t, srv, http.MethodGet, "/sandboxes/"+id, key, nil)
	assert.Equal(t, http.StatusNotFound, status, "get after delete")
}

func TestServerValidatesCreate(t *testing.T) {
	srv := opensandboxtest.NewServer(t, opensandboxtest.ServerConfig{})
	for _, tt := range []struct {
		name string
		mod  func(map[string]any)
	}{
		{"short timeout", func(b map[string]any) { b["timeout"] = 30 }},
		{"no timeout", func(b map[string]any) { delete(b, "timeout") }},
		{"no entrypoint", func(b map[string]any) { delete(b, "entrypoint") }},
		{"no image without pool", func(b map[string]any) { delete(b, "image") }},
		{"unknown field", func(b map[string]any) { b["templateID"] = "base" }},
		{"reserved metadata", func(b map[string]any) { b["metadata"] = map[string]string{"opensandbox.io/id": "x"} }},
		{"metadata value not a label", func(b map[string]any) { b["metadata"] = map[string]string{"k": "-bad-"} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := createBody(nil)
			tt.mod(b)
			status, _, body := call(t, srv, http.MethodPost, "/sandboxes", srv.APIKey(), b)
			assert.Equal(t, http.StatusBadRequest, status, "create: %v", body)
			assert.NotNil(t, body["code"], "create: an ErrorResponse")
		})
	}
	// With a pool, image and resourceLimits come from the pool.
	b := createBody(nil)
	delete(b, "image")
	delete(b, "resourceLimits")
	b["extensions"] = map[string]string{"poolRef": "ci-vm"}
	status, _, body := call(t, srv, http.MethodPost, "/sandboxes", srv.APIKey(), b)
	assert.Equal(t, http.StatusAccepted, status, "create from a pool: %v", body)
}

func TestServerFaults(t *testing.T) {
	srv := opensandboxtest.NewServer(t, opensandboxtest.ServerConfig{})
	srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Status: http.StatusTooManyRequests, RetryAfter: "3", Count: 2})
	for range 2 {
		status, hdr, _ := call(t, srv, http.MethodGet, "/sandboxes", srv.APIKey(), nil)
		assert.Equal(t, http.StatusTooManyRequests, status, "faulted request")
		assert.Equal(t, "3", hdr.Get("Retry-After"), "faulted request")
	}
	status, _, _ := call(t, srv, http.MethodGet, "/sandboxes", srv.APIKey(), nil)
	assert.Equal(t, http.StatusOK, status, "after the faults")
	srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Status: http.StatusInternalServerError, AfterEffect: true})
	status, _, _ = call(t, srv, http.MethodPost, "/sandboxes", srv.APIKey(), createBody(nil))
	assert.Equal(t, http.StatusInternalServerError, status, "after-effect fault")
	assert.Len(t, srv.Sandboxes(), 1, "the after-effect fault created its sandbox")
	got := srv.Requests()
	require.Len(t, got, 4, "requests = %+v", got)
	assert.True(t, strings.HasSuffix(got[3].Path, "/sandboxes"), "requests = %+v", got)
}
