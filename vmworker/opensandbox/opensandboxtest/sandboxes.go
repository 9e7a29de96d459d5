package opensandboxtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ScriptEnv is the sandbox environment variable that tells the fake what the sandbox does;
// its values are the Script constants. A sandbox without it runs until deleted.
const ScriptEnv = "VMWORKERTEST_SCRIPT"

// Script is what a fake sandbox does once created.
type Script string

// Scripts.
const (
	// ScriptRun runs until deleted or expired.
	ScriptRun Script = "run"
	// ScriptExit runs for ServerConfig.RunFor, then is Terminated.
	ScriptExit Script = "exit"
	// ScriptFail runs for ServerConfig.RunFor, then is Failed.
	ScriptFail Script = "fail"
	// ScriptNeverRunning stays Pending.
	ScriptNeverRunning Script = "never-running"
	// ScriptFailStart fails while provisioning.
	ScriptFailStart Script = "fail-start"
)

// Sandbox is the fake's view of a sandbox, including what the API does not return (env).
type Sandbox struct {
	ID                     string
	State, Reason, Message string
	Image                  string
	Timeout                int
	Entrypoint             []string
	Env, Metadata          map[string]string
	ResourceLimits         map[string]string
	Extensions             map[string]string
}

// createBody is CreateSandboxRequest as the published spec has it. Unknown fields are refused,
// so a client that sends anything else finds out.
type createBody struct {
	Image          *wireImage        `json:"image"`
	Timeout        *int              `json:"timeout"`
	ResourceLimits map[string]string `json:"resourceLimits"`
	Env            map[string]string `json:"env"`
	Metadata       map[string]string `json:"metadata"`
	Entrypoint     []string          `json:"entrypoint"`
	NetworkPolicy  json.RawMessage   `json:"networkPolicy"`
	Volumes        json.RawMessage   `json:"volumes"`
	Extensions     map[string]string `json:"extensions"`
}

type wireStatus struct {
	State            string `json:"state"`
	Reason           string `json:"reason,omitempty"`
	Message          string `json:"message,omitempty"`
	LastTransitionAt string `json:"lastTransitionAt,omitempty"`
}

type wireImage struct {
	URI string `json:"uri"`
}

// wireSandbox is the Sandbox schema (GET and list) and, without image, CreateSandboxResponse.
type wireSandbox struct {
	ID         string            `json:"id"`
	Image      *wireImage        `json:"image,omitempty"`
	Status     wireStatus        `json:"status"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Entrypoint []string          `json:"entrypoint"`
	ExpiresAt  string            `json:"expiresAt"`
	CreatedAt  string            `json:"createdAt"`
}

type fakeSandbox struct {
	id        string
	body      createBody
	script    Script
	created   time.Time
	deleted   time.Time
	pending   bool // never leaves Pending
	forced    *wireStatus
	runFor    time.Duration
	provision time.Duration
	linger    time.Duration
}

// status is the sandbox's state at now; gone reports a deleted sandbox past its linger.
func (sb *fakeSandbox) status(now time.Time) (st wireStatus, gone bool) {
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	if !sb.deleted.IsZero() {
		switch since := now.Sub(sb.deleted); {
		case since >= sb.linger:
			return wireStatus{}, true
		case since < sb.linger/2:
			return wireStatus{State: "Stopping", Reason: "user_delete", Message: "Sandbox is being deleted", LastTransitionAt: at(sb.deleted)}, false
		default:
			return wireStatus{State: "Terminated", Reason: "user_delete", Message: "Sandbox was deleted", LastTransitionAt: at(sb.deleted.Add(sb.linger / 2))}, false
		}
	}
	if sb.forced != nil {
		return *sb.forced, false
	}
	if expires := sb.created.Add(time.Duration(*sb.body.Timeout) * time.Second); !now.Before(expires) {
		return wireStatus{State: "Terminated", Reason: "ttl_expiry", Message: "Sandbox timeout reached", LastTransitionAt: at(expires)}, false
	}
	running := sb.created.Add(sb.provision)
	switch {
	case sb.pending || sb.script == ScriptNeverRunning || now.Before(running):
		return wireStatus{State: "Pending", Reason: "provisioning", Message: "Waiting for a pool member", LastTransitionAt: at(sb.created)}, false
	case sb.script == ScriptFailStart:
		return wireStatus{State: "Failed", Reason: "provision_failed", Message: "Pod failed to start", LastTransitionAt: at(running)}, false
	}
	ended := running.Add(sb.runFor)
	switch {
	case sb.script == ScriptExit && !now.Before(ended):
		return wireStatus{State: "Terminated", Reason: "completed", Message: "Entry process exited", LastTransitionAt: at(ended)}, false
	case sb.script == ScriptFail && !now.Before(ended):
		return wireStatus{State: "Failed", Reason: "runtime_error", Message: "Entry process failed", LastTransitionAt: at(ended)}, false
	}
	return wireStatus{State: "Running", Reason: "ready", Message: "Sandbox is running", LastTransitionAt: at(running)}, false
}

func (sb *fakeSandbox) wire(now time.Time, withImage bool) wireSandbox {
	st, _ := sb.status(now)
	w := wireSandbox{ID: sb.id, Status: st, Metadata: maps.Clone(sb.body.Metadata), Entrypoint: slices.Clone(sb.body.Entrypoint),
		CreatedAt: sb.created.UTC().Format(time.RFC3339Nano),
		ExpiresAt: sb.created.Add(time.Duration(*sb.body.Timeout) * time.Second).UTC().Format(time.RFC3339Nano)}
	if withImage && sb.body.Image != nil {
		w.Image = &wireImage{URI: sb.body.Image.URI}
	}
	return w
}

// lookup returns the live sandbox id, removing it if its delete linger is over. s.mu is held.
func (s *Server) lookup(id string, now time.Time) (*fakeSandbox, bool) {
	sb, ok := s.sandboxes[id]
	if !ok {
		return nil, false
	}
	if _, gone := sb.status(now); gone {
		delete(s.sandboxes, id)
		return nil, false
	}
	return sb, true
}

var (
	labelNameRe  = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelValueRe = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
	dnsSubRe     = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
)

// validate checks a create body as the spec and the server do; it returns the error code and
// message of a 400.
func (s *Server) validate(b *createBody) (string, string) {
	pool := b.Extensions["poolRef"]
	switch {
	case b.Timeout == nil:
		return "SANDBOX::INVALID_PARAMETER", "timeout is required"
	case *b.Timeout < 60 || *b.Timeout > 86400:
		return "SANDBOX::INVALID_PARAMETER", fmt.Sprintf("timeout %d: must be 60 to 86400 seconds", *b.Timeout)
	case len(b.Entrypoint) == 0:
		return "DOCKER::INVALID_ENTRYPOINT", "Entrypoint must contain at least one command."
	case pool == "" && (b.Image == nil || strings.TrimSpace(b.Image.URI) == ""):
		return "SANDBOX::INVALID_PARAMETER", "image is required when extensions.poolRef is not provided"
	case pool == "" && b.ResourceLimits == nil:
		return "SANDBOX::INVALID_PARAMETER", "resourceLimits is required when poolRef is not provided."
	case pool != "" && len(b.Volumes) > 0 && string(b.Volumes) != "null":
		return "SANDBOX::INVALID_PARAMETER", "Pool mode does not support volumes."
	}
	for k, v := range b.Metadata {
		name := k
		if prefix, rest, ok := strings.Cut(k, "/"); ok {
			if prefix == "" || len(prefix) > 253 || !dnsSubRe.MatchString(prefix) {
				return "SANDBOX::INVALID_METADATA_LABEL", fmt.Sprintf("Metadata key '%s' is invalid", k)
			}
			name = rest
		}
		switch {
		case strings.HasPrefix(k, "opensandbox.io/"):
			return "SANDBOX::INVALID_METADATA_LABEL", fmt.Sprintf("Metadata key '%s' uses the reserved prefix 'opensandbox.io/'.", k)
		case len(name) > 63 || !labelNameRe.MatchString(name):
			return "SANDBOX::INVALID_METADATA_LABEL", fmt.Sprintf("Metadata key '%s' is invalid", k)
		case len(v) > 63 || !labelValueRe.MatchString(v):
			return "SANDBOX::INVALID_METADATA_LABEL", fmt.Sprintf("Metadata value '%s' is invalid", v)
		}
	}
	return "", ""
}

func (s *Server) create(w http.ResponseWriter, body []byte) {
	var b createBody
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "The request was invalid or malformed: "+err.Error())
		return
	}
	if code, msg := s.validate(&b); code != "" {
		writeError(w, http.StatusBadRequest, code, msg)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if !now.After(s.lastCreated) {
		now = s.lastCreated.Add(time.Nanosecond)
	}
	s.lastCreated = now
	pool := b.Extensions["poolRef"]
	sb := &fakeSandbox{
		id: newUUID(), body: b, script: Script(b.Env[ScriptEnv]), created: now,
		pending:   s.neverRunning || (pool != "" && s.cfg.Pools != nil && !slices.Contains(s.cfg.Pools, pool)),
		runFor:    s.cfg.RunFor,
		provision: s.cfg.ProvisionDelay,
		linger:    s.cfg.DeleteLinger,
	}
	s.sandboxes[sb.id] = sb
	resp := sb.wire(now, false)
	resp.Status = wireStatus{State: "Pending", Reason: "created", Message: "Sandbox accepted for provisioning", LastTransitionAt: resp.CreatedAt}
	w.Header().Set("Location", "/v1/sandboxes/"+sb.id)
	writeJSON(w, http.StatusAccepted, resp)
}

func (s *Server) get(w http.ResponseWriter, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	sb, ok := s.lookup(id, now)
	if !ok {
		writeError(w, http.StatusNotFound, "KUBERNETES::SANDBOX_NOT_FOUND", fmt.Sprintf("Sandbox %s not found", id))
		return
	}
	writeJSON(w, http.StatusOK, sb.wire(now, true))
}

func (s *Server) delete(w http.ResponseWriter, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	sb, ok := s.lookup(id, now)
	if !ok {
		writeError(w, http.StatusNotFound, "KUBERNETES::SANDBOX_NOT_FOUND", fmt.Sprintf("Sandbox %s not found", id))
		return
	}
	if sb.deleted.IsZero() {
		sb.deleted = now
	}
	if sb.linger == 0 {
		delete(s.sandboxes, id)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	filter, err := parseMetadataFilter(q.Get("metadata"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "INVALID_METADATA_FORMAT", "Invalid metadata format: "+err.Error())
		return
	}
	page, pageSize := 1, 20
	for _, p := range []struct {
		name     string
		v        *int
		min, max int
	}{{"page", &page, 1, 1 << 30}, {"pageSize", &pageSize, 1, 200}} {
		if raw := q.Get(p.name); raw != "" {
			n, err := strconv.Atoi(raw)
			if err != nil || n < p.min || n > p.max {
				writeError(w, http.StatusBadRequest, "INVALID_REQUEST", fmt.Sprintf("%s %q: want an integer from %d to %d", p.name, raw, p.min, p.max))
				return
			}
			*p.v = n
		}
	}
	states := q["state"]
	s.mu.Lock()
	now := time.Now()
	var match []*fakeSandbox
	for id := range s.sandboxes {
		sb, ok := s.lookup(id, now)
		if !ok {
			continue
		}
		st, _ := sb.status(now)
		if len(states) > 0 && !slices.Contains(states, st.State) {
			continue
		}
		ok = true
		for k, v := range filter {
			if got, has := sb.body.Metadata[k]; !has || got != v {
				ok = false
			}
		}
		if ok {
			match = append(match, sb)
		}
	}
	slices.SortFunc(match, func(a, b *fakeSandbox) int { return a.created.Compare(b.created) })
	items := []wireSandbox{}
	for i := (page - 1) * pageSize; i < len(match) && i < page*pageSize; i++ {
		items = append(items, match[i].wire(now, true))
	}
	s.mu.Unlock()
	total := len(match)
	pages := (total + pageSize - 1) / pageSize
	writeJSON(w, http.StatusOK, map[string]any{
		"items": items,
		"pagination": map[string]any{"page": page, "pageSize": pageSize, "totalItems": total,
			"totalPages": pages, "hasNextPage": page < pages},
	})
}

// parseMetadataFilter parses the metadata parameter, "k=v&k2=v2" with each part URL-encoded,
// strictly as the server's parse_qsl(strict_parsing=True) does.
func parseMetadataFilter(raw string) (map[string]string, error) {
	out := map[string]string{}
	if raw == "" {
		return out, nil
	}
	for part := range strings.SplitSeq(raw, "&") {
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("bad query field: %q", part)
		}
		var err error
		if k, err = url.QueryUnescape(k); err != nil {
			return nil, err
		}
		if v, err = url.QueryUnescape(v); err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// Sandbox returns the fake's view of sandbox id; ok is false once it is gone.
func (s *Server) Sandbox(id string) (Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.lookup(id, time.Now())
	if !ok {
		return Sandbox{}, false
	}
	return sb.view(time.Now()), true
}

// Sandboxes returns the fake's view of every sandbox that exists.
func (s *Server) Sandboxes() []Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var out []Sandbox
	for id := range s.sandboxes {
		if sb, ok := s.lookup(id, now); ok {
			out = append(out, sb.view(now))
		}
	}
	slices.SortFunc(out, func(a, b Sandbox) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// SetState forces the state of sandbox id (as the runtime would on a crash or expiry); it
// reports whether the sandbox exists.
func (s *Server) SetState(id, state, reason, message string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.lookup(id, time.Now())
	if ok {
		sb.forced = &wireStatus{State: state, Reason: reason, Message: message, LastTransitionAt: time.Now().UTC().Format(time.RFC3339Nano)}
	}
	return ok
}

func (sb *fakeSandbox) view(now time.Time) Sandbox {
	st, _ := sb.status(now)
	v := Sandbox{ID: sb.id, State: st.State, Reason: st.Reason, Message: st.Message, Timeout: *sb.body.Timeout,
		Entrypoint: slices.Clone(sb.body.Entrypoint), Env: maps.Clone(sb.body.Env), Metadata: maps.Clone(sb.body.Metadata),
		ResourceLimits: maps.Clone(sb.body.ResourceLimits), Extensions: maps.Clone(sb.body.Extensions)}
	if sb.body.Image != nil {
		v.Image = sb.body.Image.URI
	}
	return v
}
