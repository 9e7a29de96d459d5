package opensandboxtest_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/dynrunner/dynrunner/vmworker/opensandbox/opensandboxtest"
)

// call sends one raw request and returns the status, headers and decoded JSON body.
func call(t *testing.T, srv *opensandboxtest.Server, method, path, key string, body any) (int, http.Header, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(opensandboxtest.APIKeyHeader, key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(data) > 0 {
		if err := json.Unmarshal(data, &out); err != nil {
			t.Fatalf("%s %s: answer %q is not JSON: %v", method, path, data, err)
		}
	}
	if resp.Header.Get("X-Request-ID") == "" {
		t.Errorf("%s %s: no X-Request-ID", method, path)
	}
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
	if status != http.StatusUnauthorized || body["code"] != "MISSING_API_KEY" {
		t.Errorf("no key: %d %v, want 401 MISSING_API_KEY", status, body)
	}
	status, _, body = call(t, srv, http.MethodGet, "/sandboxes", "wrong", nil)
	if status != http.StatusUnauthorized || body["code"] != "INVALID_API_KEY" || body["message"] == nil {
		t.Errorf("wrong key: %d %v, want 401 INVALID_API_KEY with a message", status, body)
	}

	status, hdr, body := call(t, srv, http.MethodPost, "/sandboxes", key, createBody(map[string]string{"project": "apollo"}))
	if status != http.StatusAccepted {
		t.Fatalf("create: %d %v", status, body)
	}
	id, _ := body["id"].(string)
	if hdr.Get("Location") == "" || id == "" || body["image"] != nil {
		t.Errorf("create answer %v (Location %q): want id, no image, a Location", body, hdr.Get("Location"))
	}
	for _, field := range []string{"status", "createdAt", "expiresAt", "entrypoint", "metadata"} {
		if body[field] == nil {
			t.Errorf("create answer lacks %s: %v", field, body)
		}
	}
	if st, _ := body["status"].(map[string]any); st["state"] != "Pending" {
		t.Errorf("create answer state %v, want Pending", st["state"])
	}
	status, _, body = call(t, srv, http.MethodGet, "/sandboxes/"+id, key, nil)
	if st, _ := body["status"].(map[string]any); status != http.StatusOK || st["state"] != "Running" || body["image"] == nil {
		t.Errorf("get: %d %v, want 200 Running with the image", status, body)
	}

	for i := range 2 {
		if status, _, body := call(t, srv, http.MethodPost, "/sandboxes", key, createBody(map[string]string{"project": "other", "n": string(rune('a' + i))})); status != http.StatusAccepted {
			t.Fatalf("create: %d %v", status, body)
		}
	}
	filter := url.Values{"metadata": {url.Values{"project": {"other"}}.Encode()}, "pageSize": {"1"}}
	status, _, body = call(t, srv, http.MethodGet, "/sandboxes?"+filter.Encode(), key, nil)
	pg, _ := body["pagination"].(map[string]any)
	items, _ := body["items"].([]any)
	if status != http.StatusOK || len(items) != 1 || pg["totalItems"] != 2.0 || pg["hasNextPage"] != true || pg["totalPages"] != 2.0 {
		t.Errorf("list page 1: %d %v", status, body)
	}
	filter.Set("page", "2")
	_, _, body = call(t, srv, http.MethodGet, "/sandboxes?"+filter.Encode(), key, nil)
	if pg, _ := body["pagination"].(map[string]any); pg["hasNextPage"] != false {
		t.Errorf("list page 2: %v", body)
	}
	if status, _, _ := call(t, srv, http.MethodGet, "/sandboxes?metadata=broken", key, nil); status != http.StatusBadRequest {
		t.Errorf("malformed metadata filter: %d, want 400", status)
	}

	if status, _, _ := call(t, srv, http.MethodDelete, "/sandboxes/"+id, key, nil); status != http.StatusNoContent {
		t.Errorf("delete: %d, want 204", status)
	}
	if status, _, body := call(t, srv, http.MethodDelete, "/sandboxes/"+id, key, nil); status != http.StatusNotFound || body["code"] == nil {
		t.Errorf("second delete: %d %v, want 404 with an ErrorResponse", status, body)
	}
	if status, _, _ := call(t, srv, http.MethodGet, "/sandboxes/"+id, key, nil); status != http.StatusNotFound {
		t.Errorf("get after delete: %d, want 404", status)
	}
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
			if status, _, body := call(t, srv, http.MethodPost, "/sandboxes", srv.APIKey(), b); status != http.StatusBadRequest || body["code"] == nil {
				t.Errorf("create: %d %v, want 400 with an ErrorResponse", status, body)
			}
		})
	}
	// With a pool, image and resourceLimits come from the pool.
	b := createBody(nil)
	delete(b, "image")
	delete(b, "resourceLimits")
	b["extensions"] = map[string]string{"poolRef": "ci-vm"}
	if status, _, body := call(t, srv, http.MethodPost, "/sandboxes", srv.APIKey(), b); status != http.StatusAccepted {
		t.Errorf("create from a pool: %d %v", status, body)
	}
}

func TestServerFaults(t *testing.T) {
	srv := opensandboxtest.NewServer(t, opensandboxtest.ServerConfig{})
	srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Status: http.StatusTooManyRequests, RetryAfter: "3", Count: 2})
	for range 2 {
		status, hdr, _ := call(t, srv, http.MethodGet, "/sandboxes", srv.APIKey(), nil)
		if status != http.StatusTooManyRequests || hdr.Get("Retry-After") != "3" {
			t.Errorf("faulted request: %d Retry-After %q", status, hdr.Get("Retry-After"))
		}
	}
	if status, _, _ := call(t, srv, http.MethodGet, "/sandboxes", srv.APIKey(), nil); status != http.StatusOK {
		t.Errorf("after the faults: %d", status)
	}
	srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Status: http.StatusInternalServerError, AfterEffect: true})
	if status, _, _ := call(t, srv, http.MethodPost, "/sandboxes", srv.APIKey(), createBody(nil)); status != http.StatusInternalServerError {
		t.Errorf("after-effect fault: %d", status)
	}
	if n := len(srv.Sandboxes()); n != 1 {
		t.Errorf("after-effect fault left %d sandboxes, want 1", n)
	}
	if got := srv.Requests(); len(got) != 4 || !strings.HasSuffix(got[3].Path, "/sandboxes") {
		t.Errorf("requests = %+v", got)
	}
}
