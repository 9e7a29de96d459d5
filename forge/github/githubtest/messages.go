package githubtest

import (
	"encoding/json"
	"fmt"
)

// message is one message of a scale set's queue: either a batch of job messages or, injected by
// a test, a raw type and body sent as they are.
type message struct {
	id        int
	jobs      []wireJobMessage
	raw       bool
	rawType   string
	rawBody   string
	noStats   bool // sent without statistics (QueueMessageWithoutStatistics)
	delivered bool // fetched at least once; later job messages go into a new message
}

// enqueueLocked adds jm to scale set setID's queue, batching it into the last message if no
// poll has fetched that one yet; s.mu must be held.
func (s *Server) enqueueLocked(setID int, jm wireJobMessage) {
	set, ok := s.scaleSets[setID]
	if !ok {
		return
	}
	if n := len(set.messages); n > 0 {
		if m := set.messages[n-1]; !m.delivered && !m.raw {
			m.jobs = append(m.jobs, jm)
			s.notifyLocked()
			return
		}
	}
	set.messages = append(set.messages, &message{id: set.nextMsg, jobs: []wireJobMessage{jm}})
	set.nextMsg++
	s.notifyLocked()
}

// QueueRawMessage puts a message of type messageType with body as it is (the wire carries the
// body as a JSON string) into scale set scaleSetID's queue and returns its id: a way to send what
// GitHub should not, such as a body that is not a JSON array or a type the client does not know.
func (s *Server) QueueRawMessage(scaleSetID int, messageType, body string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, ok := s.scaleSets[scaleSetID]
	if !ok {
		return 0, fmt.Errorf("githubtest: queue raw message: %w: %d", ErrUnknownScaleSet, scaleSetID)
	}
	m := &message{id: set.nextMsg, raw: true, rawType: messageType, rawBody: body}
	set.nextMsg++
	set.messages = append(set.messages, m)
	s.notifyLocked()
	return m.id, nil
}

// QueueMessageWithoutStatistics puts a message with no job messages and no statistics (the
// wire's "statistics": null) into scale set scaleSetID's queue and returns its id: what GitHub
// should not send, as every message of its carries the scale set's statistics.
func (s *Server) QueueMessageWithoutStatistics(scaleSetID int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	set, ok := s.scaleSets[scaleSetID]
	if !ok {
		return 0, fmt.Errorf("githubtest: queue a message without statistics: %w: %d", ErrUnknownScaleSet, scaleSetID)
	}
	m := &message{id: set.nextMsg, noStats: true}
	set.nextMsg++
	set.messages = append(set.messages, m)
	s.notifyLocked()
	return m.id, nil
}

// PendingMessages reports how many messages of scale set scaleSetID are not yet deleted.
func (s *Server) PendingMessages(scaleSetID int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if set, ok := s.scaleSets[scaleSetID]; ok {
		return len(set.messages)
	}
	return 0
}

// nextMessageLocked renders the oldest undeleted message of setID above last; s.mu must be held.
func (s *Server) nextMessageLocked(setID, last int) (wireMessage, bool) {
	set, ok := s.scaleSets[setID]
	if !ok {
		return wireMessage{}, false
	}
	for _, m := range set.messages {
		if m.id <= last {
			continue
		}
		m.delivered = true
		out := wireMessage{MessageID: m.id, MessageType: messageTypeJobMessages, Statistics: s.statisticsLocked(setID)}
		if m.noStats {
			out.Statistics = nil
		}
		if m.raw {
			out.MessageType, out.Body = m.rawType, m.rawBody
			return out, true
		}
		body, err := json.Marshal(m.jobs)
		if err != nil {
			// wireJobMessage holds only strings, numbers and times: this cannot fail.
			panic(fmt.Sprintf("githubtest: encode job messages: %v", err))
		}
		out.Body = string(body)
		return out, true
	}
	return wireMessage{}, false
}

// statisticsLocked counts scale set setID's jobs and runners; s.mu must be held.
func (s *Server) statisticsLocked(setID int) *wireStatistics {
	st := &wireStatistics{}
	for _, j := range s.jobs {
		if j.scaleSetID != setID {
			continue
		}
		switch j.state {
		case JobQueued:
			st.TotalAvailableJobs++
		case JobAcquired:
			st.TotalAcquiredJobs++
		case JobAssigned:
			st.TotalAssignedJobs++
		case JobRunning:
			st.TotalAssignedJobs++
			st.TotalRunningJobs++
		case JobCompleted:
		}
	}
	for _, rn := range s.runners {
		if rn.scaleSetID != setID {
			continue
		}
		st.TotalRegisteredRunners++
		if rn.jobID != 0 {
			st.TotalBusyRunners++
		} else {
			st.TotalIdleRunners++
		}
	}
	return st
}
