package opensandboxtest

import (
	"cmp"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// APIKeyHeader is the Lifecycle API's authentication header.
const APIKeyHeader = "OPEN-SANDBOX-API-KEY"

// DefaultAPIKey is the key a Server accepts when ServerConfig.APIKey is empty.
const DefaultAPIKey = "opensandboxtest-api-key-0123456789"

// DefaultRunFor is how long ScriptExit and ScriptFail sandboxes run when ServerConfig.RunFor is
// zero.
const DefaultRunFor = 50 * time.Millisecond

// ServerConfig configures a Server.
type ServerConfig struct {
	// APIKey is the one key the server accepts (DefaultAPIKey when empty).
	APIKey string
	// Pools are the pools that exist; a sandbox from another pool stays Pending. Nil accepts
	// every pool.
	Pools []string
	// ProvisionDelay is how long a new sandbox stays Pending.
	ProvisionDelay time.Duration
	// RunFor is how long ScriptExit and ScriptFail sandboxes run (DefaultRunFor when zero).
	RunFor time.Duration
	// DeleteLinger keeps a deleted sandbox visible, Stopping for the first half and Terminated
	// for the second; zero removes it at once.
	DeleteLinger time.Duration
}

// Fault is an injected failure of the next requests.
type Fault struct {
	// Method limits the fault to requests with this method ("" matches all).
	Method string
	// Count is how many matching requests fail (one when zero).
	Count int
	// Status is the answer's status. Zero with Malformed false only delays the answer.
	Status int
	// Code and Message fill the ErrorResponse body (defaults from the status).
	Code, Message string
	// RetryAfter is the Retry-After header of the answer, if not empty.
	RetryAfter string
	// Malformed performs the request and answers its status with a body that is not JSON.
	Malformed bool
	// AfterEffect performs the request before answering with Status: the effect happens,
	// the answer is lost.
	AfterEffect bool
	// Delay holds the answer back this long (the client's timeout may strike first).
	Delay time.Duration
	// EchoBody puts the request body into the error message, as the server's validation
	// errors quote their input.
	EchoBody bool
}

// Request is a request the server received.
type Request struct {
	Method, Path, RawQuery string
	// APIKey is the OPEN-SANDBOX-API-KEY header's value.
	APIKey string
	Body   []byte
}

// Server is a fake OpenSandbox Lifecycle API server.
type Server struct {
	// URL is the API's server URL, with "/v1".
	URL string
	// RootURL is the same API without the version prefix.
	RootURL string

	srv *httptest.Server
	cfg ServerConfig

	mu           sync.Mutex
	sandboxes    map[string]*fakeSandbox
	faults       []*Fault
	requests     []Request
	delay        time.Duration
	neverRunning bool
	authStatus   int
	lastCreated  time.Time
}

// NewServer starts a Server; t's cleanup closes it.
func NewServer(t testing.TB, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.APIKey == "" {
		cfg.APIKey = DefaultAPIKey
	}
	if cfg.RunFor == 0 {
		cfg.RunFor = DefaultRunFor
	}
	s := &Server{cfg: cfg, sandboxes: map[string]*fakeSandbox{}}
	s.srv = httptest.NewServer(s)
	s.RootURL = s.srv.URL
	s.URL = s.srv.URL + "/v1"
	t.Cleanup(s.srv.Close)
	return s
}

// APIKey is the key the server accepts.
func (s *Server) APIKey() string { return s.cfg.APIKey }

// Inject makes the next matching requests fail as f says. Faults apply in the order given.
func (s *Server) Inject(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.Count <= 0 {
		f.Count = 1
	}
	s.faults = append(s.faults, &f)
}

// ClearFaults drops the faults not yet used up.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// SetDelay holds every answer back d.
func (s *Server) SetDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// SetNeverRunning makes sandboxes created from now on stay Pending.
func (s *Server) SetNeverRunning(never bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.neverRunning = never
}

// SetAuthStatus answers every request with status (401: the key is refused; 403: the key may
// not do this) whatever key it carries; zero restores normal authentication.
func (s *Server) SetAuthStatus(status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.authStatus = status
}

// Requests returns the requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	w.Header().Set("X-Request-ID", newUUID())
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery,
		APIKey: r.Header.Get(APIKeyHeader), Body: body})
	f := s.takeFault(r.Method)
	delay := s.delay
	authStatus := s.authStatus
	s.mu.Unlock()
	if f != nil {
		delay += f.Delay
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if f != nil && f.EchoBody {
		echo := *f
		echo.Message = cmp.Or(f.Message, "invalid input") + ": " + string(body)
		f = &echo
	}
	if f != nil && f.Status != 0 && !f.AfterEffect && !f.Malformed {
		writeFault(w, f)
		return
	}
	if !s.authorized(w, r, authStatus) {
		return
	}
	path, _ := strings.CutPrefix(r.URL.Path, "/v1")
	switch {
	case f != nil && f.Malformed:
		rec := httptest.NewRecorder()
		s.route(rec, r, path, body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(cmp.Or(f.Status, rec.Code))
		_, _ = io.WriteString(w, `{"id": "truncated`)
	case f != nil && f.Status != 0:
		s.route(httptest.NewRecorder(), r, path, body)
		writeFault(w, f)
	default:
		s.route(w, r, path, body)
	}
}

// takeFault returns the fault that applies to a request with method, if any. s.mu is held.
func (s *Server) takeFault(method string) *Fault {
	for i, f := range s.faults {
		if f.Method != "" && f.Method != method {
			continue
		}
		f.Count--
		if f.Count <= 0 {
			s.faults = slices.Delete(s.faults, i, i+1)
		}
		return f
	}
	return nil
}

// authorized checks the API key as the real server's middleware does.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request, authStatus int) bool {
	key := r.Header.Get(APIKeyHeader)
	switch {
	case key == "":
		writeError(w, http.StatusUnauthorized, "MISSING_API_KEY", "Authentication credentials are missing. Provide API key via "+APIKeyHeader+" header.")
	case key != s.cfg.APIKey || authStatus == http.StatusUnauthorized:
		writeError(w, http.StatusUnauthorized, "INVALID_API_KEY", "Authentication credentials are invalid. Check your API key and try again.")
	case authStatus == http.StatusForbidden:
		writeError(w, http.StatusForbidden, "FORBIDDEN", "The authenticated user lacks permission for this operation.")
	case authStatus != 0:
		writeError(w, authStatus, "AUTH_FAILED", "Authentication failed.")
	default:
		return true
	}
	return false
}

// route serves the API's sandbox paths.
func (s *Server) route(w http.ResponseWriter, r *http.Request, path string, body []byte) {
	if path == "/sandboxes" {
		switch r.Method {
		case http.MethodPost:
			s.create(w, body)
		case http.MethodGet:
			s.list(w, r)
		default:
			writeError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "Method Not Allowed")
		}
		return
	}
	id, ok := strings.CutPrefix(path, "/sandboxes/")
	if !ok || id == "" || strings.Contains(id, "/") {
		writeError(w, http.StatusNotFound, "NOT_FOUND", "Not Found (the fake serves only create, get, delete and list)")
		return
	}
	switch r.Method {
	case http.MethodGet:
		s.get(w, id)
	case http.MethodDelete:
		s.delete(w, id)
	default:
		writeError(w, http.StatusMethodNotAllowed, "METHOD_NOT_ALLOWED", "Method Not Allowed")
	}
}

func writeFault(w http.ResponseWriter, f *Fault) {
	if f.RetryAfter != "" {
		w.Header().Set("Retry-After", f.RetryAfter)
	}
	code := cmp.Or(f.Code, strings.ToUpper(strings.ReplaceAll(http.StatusText(f.Status), " ", "_")))
	writeError(w, f.Status, code, cmp.Or(f.Message, "injected fault: "+http.StatusText(f.Status)))
}

// writeError writes an ErrorResponse.
func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]string{"code": code, "message": message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func newUUID() string { return uuid.NewString() }
