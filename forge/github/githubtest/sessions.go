package githubtest

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
)

type session struct {
	id          string
	scaleSetID  int
	owner       string
	token       string
	tokenValid  bool
	maxCapacity int // the last X-ScaleSetMaxCapacity the client sent; -1 before any poll
	seen        time.Time
}

// Session is a snapshot of one message session.
type Session struct {
	ID         string
	ScaleSetID int
	Owner      string
	// MaxCapacity is the X-ScaleSetMaxCapacity of the session's last message poll, -1 before any.
	MaxCapacity int
}

// Sessions returns the open message sessions, by scale set id.
func (s *Server) Sessions() []Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Session
	for _, sess := range s.sessions {
		out = append(out, Session{ID: sess.id, ScaleSetID: sess.scaleSetID, Owner: sess.owner, MaxCapacity: sess.maxCapacity})
	}
	slices.SortFunc(out, func(a, b Session) int { return cmp.Compare(a.ScaleSetID, b.ScaleSetID) })
	return out
}

// ExpireSessionTokens expires every session's message-queue token: the next poll, delete or
// acquire with it gets 401, on which the client refreshes the session (PATCH) and retries.
func (s *Server) ExpireSessionTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sess := range s.sessions {
		sess.tokenValid = false
	}
}

// wireSessionLocked renders sess with a fresh view of its scale set; s.mu must be held.
func (s *Server) wireSessionLocked(sess *session) wireSession {
	set := s.scaleSets[sess.scaleSetID]
	return wireSession{
		SessionID:               sess.id,
		OwnerName:               sess.owner,
		RunnerScaleSet:          s.wireLocked(set),
		MessageQueueURL:         fmt.Sprintf("%s%s/sessions/%s/messages", s.srv.URL, brokerPrefix, sess.id),
		MessageQueueAccessToken: sess.token,
		Statistics:              s.statisticsLocked(set.id),
	}
}

func (s *Server) issueSessionTokenLocked(sess *session) {
	sess.token = randomToken("mq_")
	sess.tokenValid = true
	s.counts.SessionTokens++
}

// handleCreateSession is POST _apis/runtime/runnerscalesets/{id}/sessions.
func (s *Server) handleCreateSession(w http.ResponseWriter, r *http.Request) {
	var in struct {
		OwnerName string `json:"ownerName"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: decode session: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	set, ok := s.scaleSetFromPath(w, r)
	if !ok {
		return
	}
	for id, sess := range s.sessions {
		if s.opts.SessionTimeout > 0 && time.Since(sess.seen) > s.opts.SessionTimeout {
			delete(s.sessions, id) // its owner stopped polling: GitHub times the session out
			continue
		}
		if sess.scaleSetID == set.id {
			writeException(w, http.StatusConflict, ExceptionSessionConflict,
				fmt.Sprintf("githubtest: runner scale set %d already has a session, owned by %q; delete it or wait for its owner to", set.id, sess.owner))
			return
		}
	}
	sess := &session{id: uuid.NewString(), scaleSetID: set.id, owner: in.OwnerName, maxCapacity: -1, seen: time.Now()}
	s.issueSessionTokenLocked(sess)
	s.sessions[sess.id] = sess
	writeJSON(w, http.StatusOK, s.wireSessionLocked(sess))
}

// sessionFromPath finds the session of the {id} scale set named by {sid}, answering 404 if none.
func (s *Server) sessionFromPath(w http.ResponseWriter, r *http.Request) (*session, bool) {
	sess, ok := s.sessions[r.PathValue("sid")]
	if !ok || strconv.Itoa(sess.scaleSetID) != r.PathValue("id") {
		writeException(w, http.StatusNotFound, "TaskAgentSessionExpiredException", "githubtest: no session "+r.PathValue("sid")+" of runner scale set "+r.PathValue("id")+"; create a new one")
		return nil, false
	}
	return sess, true
}

// handleRefreshSession is PATCH .../sessions/{sid}: a new message-queue token.
func (s *Server) handleRefreshSession(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.sessionFromPath(w, r)
	if !ok {
		return
	}
	s.issueSessionTokenLocked(sess)
	s.counts.SessionRefresh++
	writeJSON(w, http.StatusOK, s.wireSessionLocked(sess))
}

// handleDeleteSession is DELETE .../sessions/{sid}.
func (s *Server) handleDeleteSession(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.sessionFromPath(w, r)
	if !ok {
		return
	}
	delete(s.sessions, sess.id)
	s.notifyLocked()
	w.WriteHeader(http.StatusNoContent)
}

var errQueueAuth = errors.New("message queue token expired or unknown")

// queueSessionLocked authorises a message-queue call for session sid by its bearer token.
func (s *Server) queueSessionLocked(r *http.Request, sid string) (*session, error) {
	tok, _ := bearer(r, "Bearer")
	sess, ok := s.sessions[sid]
	if !ok || !sess.tokenValid || tok != sess.token {
		return nil, errQueueAuth
	}
	return sess, nil
}

// handleGetMessage is the long poll GET {messageQueueUrl}?lastMessageId=: 200 with the oldest
// undeleted message above lastMessageId, or 202 when none comes within the timeout.
func (s *Server) handleGetMessage(w http.ResponseWriter, r *http.Request) {
	sid := r.PathValue("sid")
	last := 0
	if v := r.URL.Query().Get("lastMessageId"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: lastMessageId is not a number: "+v)
			return
		}
		last = n
	}
	timeout := time.NewTimer(s.opts.LongPollTimeout)
	defer timeout.Stop()
	for {
		s.mu.Lock()
		sess, err := s.queueSessionLocked(r, sid)
		if err != nil {
			s.counts.RejectedAuth++
			s.mu.Unlock()
			writeException(w, http.StatusUnauthorized, "TaskAgentSessionExpiredException", "githubtest: "+err.Error()+"; refresh the session")
			return
		}
		if c, err := strconv.Atoi(r.Header.Get("X-ScaleSetMaxCapacity")); err == nil {
			sess.maxCapacity = c
		}
		sess.seen = time.Now()
		if out, ok := s.nextMessageLocked(sess.scaleSetID, last); ok {
			s.counts.MessagesFetched++
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

// handleDeleteMessage is DELETE {messageQueueUrl}/{mid}: the acknowledgement.
func (s *Server) handleDeleteMessage(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, err := s.queueSessionLocked(r, r.PathValue("sid"))
	if err != nil {
		s.counts.RejectedAuth++
		writeException(w, http.StatusUnauthorized, "TaskAgentSessionExpiredException", "githubtest: "+err.Error()+"; refresh the session")
		return
	}
	mid, err := strconv.Atoi(r.PathValue("mid"))
	if err != nil {
		writeException(w, http.StatusBadRequest, "ArgumentException", "githubtest: message id is not a number: "+r.PathValue("mid"))
		return
	}
	set := s.scaleSets[sess.scaleSetID]
	for i, m := range set.messages {
		if m.id == mid {
			set.messages = append(set.messages[:i:i], set.messages[i+1:]...)
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	writeException(w, http.StatusNotFound, "MessageNotFoundException", fmt.Sprintf("githubtest: no message %d in the queue of runner scale set %d", mid, set.id))
}
