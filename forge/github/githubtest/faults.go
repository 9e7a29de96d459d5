package githubtest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
)

// Op names one operation of the protocol, for Requests and InjectFault.
type Op string

// The operations the fake serves.
const (
	OpInstallationToken  Op = "installation-token"
	OpRegistrationToken  Op = "registration-token"
	OpRunnerRegistration Op = "runner-registration"
	OpGetRunnerGroup     Op = "get-runner-group"
	OpGetScaleSet        Op = "get-scale-set"
	OpCreateScaleSet     Op = "create-scale-set"
	OpUpdateScaleSet     Op = "update-scale-set"
	OpDeleteScaleSet     Op = "delete-scale-set"
	OpCreateSession      Op = "create-session"
	OpRefreshSession     Op = "refresh-session"
	OpDeleteSession      Op = "delete-session"
	OpGetMessage         Op = "get-message"
	OpDeleteMessage      Op = "delete-message"
	OpAcquireJobs        Op = "acquire-jobs"
	OpGenerateJITConfig  Op = "generate-jit-config"
	OpGetRunner          Op = "get-runner"
	OpRemoveRunner       Op = "remove-runner"
	OpGetWorkflowRun     Op = "get-workflow-run"
	OpRerunFailedJobs    Op = "rerun-failed-jobs"
	// The stand-in protocol's calls (package standin), not GitHub's.
	OpStandInTakeJob  Op = "standin-take-job"
	OpStandInComplete Op = "standin-complete"
)

// Fault is one answer the fake gives instead of serving a request: Status with Body (an Actions
// exception naming the fault when Body is empty) and ContentType (application/json if empty).
type Fault struct {
	Status      int
	Body        string
	ContentType string
	// Withhold serves the request (its effect happens, as on GitHub) but sends no answer
	// until the client goes away or the server closes: the client sees a request that never
	// finished, as a controller killed after GitHub acted and before it heard back does.
	// Stalled, when set, is closed once the request was served.
	Withhold bool
	Stalled  chan struct{}
}

// InjectFault makes the next request to op, after any faults queued before it, answer f
// instead of being served. Each fault answers one request.
func (s *Server) InjectFault(op Op, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[op] = append(s.faults[op], f)
}

// FailOnce makes the next request to op answer status (a 5xx, say) once.
func (s *Server) FailOnce(op Op, status int) { s.InjectFault(op, Fault{Status: status}) }

// operation counts requests to op and answers the first pending fault instead of h.
func (s *Server) operation(op Op, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests[op]++
		var fault *Fault
		if q := s.faults[op]; len(q) > 0 {
			fault = &q[0]
			s.faults[op] = q[1:]
			s.counts.InjectedFaults++
		}
		s.mu.Unlock()
		if fault == nil {
			h(w, r)
			return
		}
		if fault.Withhold {
			h(httptest.NewRecorder(), r)
			if fault.Stalled != nil {
				close(fault.Stalled)
			}
			select {
			case <-r.Context().Done():
			case <-s.done:
			}
			return
		}
		if fault.Body == "" {
			writeException(w, fault.Status, "GitHubTestInjectedFault", "githubtest: fault injected into "+string(op))
			return
		}
		ct := fault.ContentType
		if ct == "" {
			ct = "application/json"
		}
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(fault.Status)
		_, _ = w.Write([]byte(fault.Body))
	})
}

// Exception type names the client recognises, or that tests match on.
const (
	ExceptionSessionConflict = "TaskAgentSessionConflictException"
	ExceptionAgentExists     = "AgentExistsException"
	ExceptionAgentNotFound   = "AgentNotFoundException"
	ExceptionJobStillRunning = "JobStillRunningException"
)

// writeException answers with the Actions service's error shape, which the client decodes.
func writeException(w http.ResponseWriter, status int, typeName, message string) {
	writeJSON(w, status, map[string]string{"typeName": typeName, "message": message})
}

// writeGitHubError answers with GitHub REST API's error shape.
func writeGitHubError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, map[string]string{"message": message, "documentation_url": "https://docs.github.com/rest"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "githubtest: encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
