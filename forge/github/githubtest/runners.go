package githubtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/dynrunner/dynrunner/forge/github/githubtest/standin"
)

type runner struct {
	id         int
	name       string
	scaleSetID int
	workFolder string
	credential string
	jobID      int64 // the job it runs; 0 while idle
}

// Runner is a snapshot of one JIT runner.
type Runner struct {
	ID         int
	Name       string
	ScaleSetID int
	// JobID is the job the runner runs, 0 while it is idle.
	JobID int64
}

// Runners returns the registered runners, by id.
func (s *Server) Runners() []Runner {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Runner
	for id := 1; id < s.nextRunner; id++ {
		if rn, ok := s.runners[id]; ok {
			out = append(out, Runner{ID: rn.id, Name: rn.name, ScaleSetID: rn.scaleSetID, JobID: rn.jobID})
		}
	}
	return out
}

// JITConfig is what the fake's encoded JIT configuration holds, decoded (standin.JITConfig).
type JITConfig = standin.JITConfig

// DecodeJITConfig decodes an encoded JIT configuration the fake issued (standin.DecodeJITConfig).
func DecodeJITConfig(encoded string) (JITConfig, error) { return standin.DecodeJITConfig(encoded) }

func (rn *runner) wire() *wireRunnerReference {
	return &wireRunnerReference{ID: rn.id, Name: rn.name, RunnerScaleSetID: rn.scaleSetID}
}

// handleGenerateJITConfig is POST .../{id}/generatejitconfig with {name, workFolder}: it
// registers a runner of the scale set and answers its JIT configuration.
func (s *Server) handleGenerateJITConfig(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Name       string `json:"name"`
		WorkFolder string `json:"workFolder"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Name == "" {
		writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: body must be {\"name\": <runner name>, \"workFolder\": ...} with a name")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	set, ok := s.scaleSetFromPath(w, r)
	if !ok {
		return
	}
	for _, rn := range s.runners {
		if strings.EqualFold(rn.name, in.Name) {
			writeException(w, http.StatusConflict, ExceptionAgentExists,
				fmt.Sprintf("githubtest: a runner named %q exists (id %d); pick another name or remove it", in.Name, rn.id))
			return
		}
	}
	rn := &runner{id: s.nextRunner, name: in.Name, scaleSetID: set.id, workFolder: in.WorkFolder, credential: randomToken("runner_")}
	enc, err := standin.EncodeJITConfig(JITConfig{
		AgentID: rn.id, AgentName: rn.name, PoolID: 1, ServerURL: s.ActionsServiceURL(), GitHubURL: s.srv.URL,
		WorkFolder: rn.workFolder, Ephemeral: true, Credential: rn.credential,
	}, s.srv.URL+actionsPrefix+"/_apis/oauth2/token")
	if err != nil {
		writeException(w, http.StatusInternalServerError, "GitHubTestEncodeException", "githubtest: "+err.Error())
		return
	}
	s.nextRunner++
	s.runners[rn.id] = rn
	s.notifyLocked()
	writeJSON(w, http.StatusOK, wireJITConfig{Runner: rn.wire(), EncodedJITConfig: enc})
}

// runnerFromPath finds the runner named by the {id} path value, answering 404 if none.
func (s *Server) runnerFromPath(w http.ResponseWriter, r *http.Request) (*runner, bool) {
	id, err := strconv.Atoi(r.PathValue("id"))
	rn, ok := s.runners[id]
	if err != nil || !ok {
		writeException(w, http.StatusNotFound, ExceptionAgentNotFound, "githubtest: no runner "+r.PathValue("id"))
		return nil, false
	}
	return rn, true
}

// handleGetRunner is GET _apis/distributedtask/pools/0/agents/{id}.
func (s *Server) handleGetRunner(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rn, ok := s.runnerFromPath(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, rn.wire())
}

// handleGetRunnerByName is GET _apis/distributedtask/pools/0/agents?agentName=.
func (s *Server) handleGetRunnerByName(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("agentName")
	s.mu.Lock()
	defer s.mu.Unlock()
	list := wireList[*wireRunnerReference]{Value: []*wireRunnerReference{}}
	for id := 1; id < s.nextRunner; id++ {
		if rn, ok := s.runners[id]; ok && (name == "" || strings.EqualFold(rn.name, name)) {
			list.Value = append(list.Value, rn.wire())
		}
	}
	list.Count = len(list.Value)
	writeJSON(w, http.StatusOK, list)
}

// handleRemoveRunner is DELETE _apis/distributedtask/pools/0/agents/{id}; a runner with a job
// running cannot be removed.
func (s *Server) handleRemoveRunner(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rn, ok := s.runnerFromPath(w, r)
	if !ok {
		return
	}
	if rn.jobID != 0 {
		writeException(w, http.StatusBadRequest, ExceptionJobStillRunning,
			fmt.Sprintf("githubtest: runner %d is running job %d; wait for JobCompleted", rn.id, rn.jobID))
		return
	}
	delete(s.runners, rn.id)
	s.notifyLocked()
	w.WriteHeader(http.StatusNoContent)
}
