package githubtest

import (
	"crypto/subtle"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/dynrunner/dynrunner/forge/github/githubtest/standin"
)

// The runner-facing side of the fake speaks the stand-in protocol of package standin, not
// GitHub's: see that package and the doc of this one.

// CertificatePEM is the certificate the server presents with Options.TLS, PEM-encoded, for the
// stand-in runner's STANDIN_RUNNER_CA_FILE; nil without TLS.
func (s *Server) CertificatePEM() []byte {
	cert := s.srv.Certificate()
	if cert == nil {
		return nil
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// standInRunnerLocked finds the runner of the {id} path value, live or retired, and checks the
// request's bearer credential against it, answering 404 or 401 if that fails; s.mu must be held.
func (s *Server) standInRunnerLocked(w http.ResponseWriter, r *http.Request) (rn *runner, retired bool, ok bool) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err == nil {
		rn, ok = s.runners[id]
		if !ok {
			rn, retired = s.retired[id]
		}
	}
	if rn == nil {
		writeException(w, http.StatusNotFound, ExceptionAgentNotFound,
			"githubtest: no runner "+r.PathValue("id")+"; it was removed, or never registered")
		return nil, false, false
	}
	cred, isBearer := bearer(r, "Bearer")
	if !isBearer || subtle.ConstantTimeCompare([]byte(cred), []byte(rn.credential)) != 1 {
		s.counts.RejectedAuth++
		writeException(w, http.StatusUnauthorized, "InvalidRunnerCredentialException",
			fmt.Sprintf("githubtest: the bearer credential is not runner %d's (the clientId of its JIT configuration's .credentials)", rn.id))
		return nil, false, false
	}
	return rn, retired, true
}

// handleStandInTakeJob is POST {actions}/_standin/runners/{id}/job: a long poll in which the
// runner takes the oldest job assigned to its scale set, which then starts on it (JobStarted).
func (s *Server) handleStandInTakeJob(w http.ResponseWriter, r *http.Request) {
	timeout := time.NewTimer(s.opts.LongPollTimeout)
	defer timeout.Stop()
	for {
		s.mu.Lock()
		rn, retired, ok := s.standInRunnerLocked(w, r)
		if !ok {
			s.mu.Unlock()
			return
		}
		if retired || rn.jobID != 0 {
			s.mu.Unlock()
			writeException(w, http.StatusConflict, "RunnerAlreadyUsedException",
				fmt.Sprintf("githubtest: runner %d already took job %d; a JIT configuration is single-use", rn.id, rn.jobID))
			return
		}
		var next *job
		for _, j := range s.jobs {
			if j.scaleSetID == rn.scaleSetID && j.state == JobAssigned && (next == nil || j.id < next.id) {
				next = j
			}
		}
		if next != nil {
			s.startLocked(next, rn)
			out := standin.Job{
				RunnerRequestID: next.id,
				JobID:           next.spec.JobID,
				Owner:           next.spec.Owner,
				Repository:      next.spec.Owner + "/" + next.spec.Repository,
				WorkflowRef:     next.spec.WorkflowRef,
				DisplayName:     next.spec.DisplayName,
				EventName:       next.spec.EventName,
				WorkflowRunID:   next.spec.WorkflowRunID,
				Run:             next.spec.Run,
			}
			s.mu.Unlock()
			writeJSON(w, http.StatusOK, out)
			return
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-timeout.C:
			w.WriteHeader(http.StatusAccepted)
			return
		case <-r.Context().Done():
			return
		case <-s.done:
			w.WriteHeader(http.StatusAccepted)
			return
		}
	}
}

// handleStandInComplete is POST {actions}/_standin/runners/{id}/jobs/{jobid}/complete with a
// standin.Completion: the runner's job completes (JobCompleted) and the runner is retired.
func (s *Server) handleStandInComplete(w http.ResponseWriter, r *http.Request) {
	var in standin.Completion
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, standin.MaxCompletionBytes)).Decode(&in); err != nil {
		if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
			writeException(w, http.StatusRequestEntityTooLarge, "ArgumentException",
				fmt.Sprintf("githubtest: a completion is at most %d bytes", standin.MaxCompletionBytes))
			return
		}
		writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: body must be {\"result\": ..., \"log\": ...}: "+err.Error())
		return
	}
	if !standin.ValidResult(in.Result) {
		writeException(w, http.StatusBadRequest, "ArgumentException",
			fmt.Sprintf("githubtest: result %q is none of %s, %s, %s", in.Result, standin.ResultSucceeded, standin.ResultFailed, standin.ResultCanceled))
		return
	}
	jobID, err := strconv.ParseInt(r.PathValue("jobid"), 10, 64)
	if err != nil {
		writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: job id is not a number: "+r.PathValue("jobid"))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rn, _, ok := s.standInRunnerLocked(w, r)
	if !ok {
		return
	}
	j, ok := s.jobs[jobID]
	if !ok || rn.jobID != jobID || j.runnerID != rn.id {
		took := "it has taken no job"
		if rn.jobID != 0 {
			took = fmt.Sprintf("it took job %d", rn.jobID)
		}
		writeException(w, http.StatusConflict, "JobNotOfRunnerException",
			fmt.Sprintf("githubtest: job %d is not runner %d's: %s", jobID, rn.id, took))
		return
	}
	if j.state == JobCompleted {
		if j.result == in.Result && j.log == in.Log {
			writeJSON(w, http.StatusOK, struct{}{}) // a retry of the completion that ended it
			return
		}
		writeException(w, http.StatusConflict, "JobAlreadyCompletedException",
			fmt.Sprintf("githubtest: job %d already completed with result %s", j.id, j.result))
		return
	}
	j.log = in.Log
	s.completeLocked(j, in.Result)
	writeJSON(w, http.StatusOK, struct{}{})
}
