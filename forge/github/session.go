package github

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/actions/scaleset"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/lease"
)

// Handler handles the messages of one scale set's session. It is called by the replica holding
// the session only, one message at a time, under a context that ends with that replica's
// belief in the session's lease; a message is deleted (acknowledged) only after Handle
// returned nil. Handle must be idempotent: after a failover the new holder receives again
// every message the old one did not delete. A message's Statistics may be nil (GitHub sent
// none, or they could not be parsed): nothing is known then of the scale set's jobs.
type Handler interface {
	Handle(ctx context.Context, s *Session, msg *scaleset.RunnerScaleSetMessage) error
	// Reconcile runs after every poll, a message or none, under the same context: what
	// needs doing without a message (an earlier holder's unfinished work).
	Reconcile(ctx context.Context, s *Session) error
}

// SessionLeaseKey is the key in eventlog.BucketLeases of scale set id's message session: the
// replica holding it is the only one with a session of that scale set (GitHub refuses a second
// with 409 TaskAgentSessionConflictException).
func SessionLeaseKey(scaleSetID int) string { return fmt.Sprintf("github-session-%d", scaleSetID) }

// DefaultRetry is how long a Session waits after a failed call before it tries again.
const DefaultRetry = 5 * time.Second

// SessionConfig configures a Session.
type SessionConfig struct {
	Set     ScaleSet
	Clients *Clients
	// Leases is eventlog.BucketLeases; TTL its TTL (eventlog.Config.LeasesTTL).
	Leases jetstream.KeyValue
	TTL    time.Duration
	// Holder names this replica (its actor); GitHub shows it as the session's owner.
	Holder string
	// Capacity is how many runners the scale set may have now, sent with every poll
	// (X-ScaleSetMaxCapacity).
	Capacity func() int
	Handler  Handler
	// Retry is the wait after a failure; DefaultRetry if zero.
	Retry time.Duration
	// Options are the session client's HTTP options (tests shorten the retries).
	Options []scaleset.HTTPOption
	Log     zerolog.Logger
	Metrics *Metrics
}

// Session keeps the one message session of a scale set across all scheduler replicas: the
// replica holding the session's lease in JetStream opens it, long-polls its message queue and
// hands each message to the Handler; when it loses the lease (it stops, pauses past the lease,
// or is cut off from NATS) it stops acting at once and closes the session if GitHub can still
// be reached, so the next holder can open one.
type Session struct {
	cfg   SessionConfig
	lease *lease.Lease
	// client is the open session while held; only Run's goroutine uses it.
	client *scaleset.MessageSessionClient
	last   int // the id of the last message handled
}

// NewSession returns a Session; Run runs it.
func NewSession(cfg SessionConfig) *Session {
	if cfg.Retry <= 0 {
		cfg.Retry = DefaultRetry
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Capacity == nil {
		cfg.Capacity = func() int { return 0 }
	}
	label := scaleSetLabel(cfg.Set.ID)
	held := cfg.Metrics.SessionHeld.WithLabelValues(label)
	held.Set(0)
	l := lease.New(cfg.Leases, SessionLeaseKey(cfg.Set.ID), cfg.Holder, cfg.TTL,
		cfg.Log.With().Str("lease", SessionLeaseKey(cfg.Set.ID)).Logger(), nil)
	return &Session{cfg: cfg, lease: l}
}

// Set is the scale set this session serves.
func (s *Session) Set() ScaleSet { return s.cfg.Set }

// Client is the open message session, for the Handler (AcquireJobs); nil when none is open.
func (s *Session) Client() *scaleset.MessageSessionClient { return s.client }

// Clients are the GitHub clients, for the Handler (JIT configurations, runners).
func (s *Session) Clients() *Clients { return s.cfg.Clients }

// Held reports whether this replica holds the session's lease now.
func (s *Session) Held() bool { return s.lease.Held() }

// Run takes part in the election for the session until ctx ends, and serves the session while
// it holds it. It returns nil when ctx ends.
func (s *Session) Run(ctx context.Context) error {
	leaseDone := make(chan struct{})
	leaseCtx, stopLease := context.WithCancel(context.WithoutCancel(ctx))
	go func() { defer close(leaseDone); _ = s.lease.Run(leaseCtx) }()
	defer func() {
		s.close()
		stopLease() // releases the lease after the session is closed
		<-leaseDone
	}()
	wait := time.NewTimer(0)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-wait.C:
		}
		next := s.step(ctx)
		wait.Reset(next)
	}
}

// step does one thing: opens the session, polls and handles one message, or closes the
// session when the lease is gone. It returns how long to wait before the next step.
func (s *Session) step(ctx context.Context) time.Duration {
	hctx, cancel, held := s.lease.Context(ctx)
	defer cancel()
	if !held {
		s.close()
		return s.cfg.TTL / 6
	}
	if s.client == nil {
		if err := s.open(hctx); err != nil {
			return s.cfg.Retry
		}
	}
	msg, err := s.client.GetMessage(hctx, s.last, max(s.cfg.Capacity(), 0))
	if err == nil && msg == nil {
		if err := s.cfg.Handler.Reconcile(hctx, s); err != nil && hctx.Err() == nil {
			s.cfg.Log.Warn().Err(err).Int("scale_set", s.cfg.Set.ID).Msg("github: reconcile the scale set's slots")
			return s.cfg.Retry
		}
		return 0 // the long poll ended with nothing
	}
	if err != nil {
		if ctx.Err() != nil || hctx.Err() != nil {
			return 0 // the lease's belief ended mid-poll: the next step looks again
		}
		if malformed(err) {
			return s.salvage(hctx, err)
		}
		s.failed("poll the message queue", err)
		return s.cfg.Retry
	}
	if err := s.cfg.Handler.Handle(hctx, s, msg); err != nil {
		s.cfg.Log.Warn().Err(err).Int("message", msg.MessageID).Int("scale_set", s.cfg.Set.ID).
			Msg("github: handling a message failed; it stays in the queue and is handled again")
		return s.cfg.Retry
	}
	if err := s.client.DeleteMessage(hctx, msg.MessageID); err != nil {
		s.failed("acknowledge a message", err)
		return s.cfg.Retry
	}
	s.last = msg.MessageID
	return 0
}

// open creates the message session. GitHub refuses a second session of a scale set (409): a
// previous holder's that was not closed (it died) blocks the next until GitHub times it out.
func (s *Session) open(ctx context.Context) error {
	client, err := s.cfg.Clients.Client().MessageSessionClient(ctx, s.cfg.Set.ID, s.cfg.Holder, s.cfg.Options...)
	if err != nil {
		if isSessionConflict(err) {
			s.cfg.Metrics.SessionConflicts.WithLabelValues(scaleSetLabel(s.cfg.Set.ID)).Inc()
			s.cfg.Log.Warn().Int("scale_set", s.cfg.Set.ID).
				Msg("github: the scale set has another message session (an earlier holder that did not close it); retrying until GitHub times it out")
			return err
		}
		s.failed("open the message session", err)
		return err
	}
	if got := client.Session().RunnerScaleSet; got != nil && got.ID != s.cfg.Set.ID {
		// Its message queue is another scale set's: its jobs would get this tier's slots.
		err := fmt.Errorf("github: GitHub answered the request for a message session of scale set %d (%s) with a session of scale set %d (%s); refused, and closed",
			s.cfg.Set.ID, s.cfg.Set.Name, got.ID, got.Name)
		s.cfg.Metrics.SessionsRefused.WithLabelValues(scaleSetLabel(s.cfg.Set.ID)).Inc()
		s.cfg.Log.Error().Err(err).Int("scale_set", s.cfg.Set.ID).Msg("github: a message session of another scale set")
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = client.Close(ctx)
		return err
	}
	s.client, s.last = client, 0
	s.cfg.Metrics.SessionHeld.WithLabelValues(scaleSetLabel(s.cfg.Set.ID)).Set(1)
	s.cfg.Log.Info().Int("scale_set", s.cfg.Set.ID).Str("scale_set_name", s.cfg.Set.Name).Msg("github: holding the message session")
	return nil
}

// close closes the open session, if any, with a short deadline of its own (the lease may be
// gone already; GitHub may not be reachable).
func (s *Session) close() {
	if s.client == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.client.Close(ctx); err != nil {
		s.cfg.Log.Warn().Err(err).Int("scale_set", s.cfg.Set.ID).Msg("github: close the message session; GitHub times it out")
	}
	s.client = nil
	s.cfg.Metrics.SessionHeld.WithLabelValues(scaleSetLabel(s.cfg.Set.ID)).Set(0)
	s.cfg.Log.Info().Int("scale_set", s.cfg.Set.ID).Msg("github: closed the message session")
}

// failed logs a failed call; when GitHub refused the credentials, the clients make a new one
// and the session is opened again with it.
func (s *Session) failed(what string, err error) {
	s.cfg.Log.Warn().Err(err).Int("scale_set", s.cfg.Set.ID).Msg("github: " + what)
	if refusedCredentials(err) {
		s.cfg.Clients.Refused()
		s.close() // it came from the refused client; the next step opens one with a new client
	}
}

// isSessionConflict reports GitHub's 409 for a second session; the client exports no error for
// it, only the exception's name in the text.
func isSessionConflict(err error) bool {
	return err != nil && strings.Contains(err.Error(), "TaskAgentSessionConflictException")
}

// malformed reports whether the client could not parse a message it received: its envelope,
// its type or its batch of job messages. The client keeps the message's id to itself, and
// would receive the same message at every poll.
func malformed(err error) bool {
	s := err.Error()
	for _, m := range []string{"failed to parse message response", "unsupported message type"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// salvage handles a message the client could not parse. It reads the message again itself:
// an answer garbled on the way (a proxy cutting it short) reads well the second time and is
// handled as any other, so no message is acknowledged unhandled for want of a good read. A
// message that is itself garbled has what can be read of it handled (its statistics and each
// job message of its batch that decodes) and the rest dropped, logged and counted, then it
// is acknowledged; one whose type the client does not know, or whose body is no batch of job
// messages, is dropped whole. It returns how long to wait before the next step.
func (s *Session) salvage(ctx context.Context, cause error) time.Duration {
	label := scaleSetLabel(s.cfg.Set.ID)
	r, err := s.reread(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.cfg.Log.Error().Err(err).AnErr("cause", cause).Int("scale_set", s.cfg.Set.ID).
				Msg("github: a message the client cannot parse blocks the queue, and its id cannot be read either")
		}
		return s.cfg.Retry
	}
	if r == nil {
		return 0 // nothing there any more: the garbled answer was of a message deleted since
	}
	msg := r.msg
	if r.whole != nil {
		s.cfg.Log.Error().Err(r.whole).AnErr("client", cause).Int("message", r.id).Int("scale_set", s.cfg.Set.ID).
			Msg("github: dropping a message that cannot be parsed (acknowledged unhandled)")
	} else {
		for _, bad := range r.bad {
			s.cfg.Log.Error().Err(bad).Int("message", r.id).Int("scale_set", s.cfg.Set.ID).
				Msg("github: dropping a part of a message that cannot be parsed (its statistics, or a job message of its batch); the rest is handled")
		}
		if len(r.bad) == 0 {
			s.cfg.Log.Warn().AnErr("client", cause).Int("message", r.id).Int("scale_set", s.cfg.Set.ID).
				Msg("github: the client could not parse an answer of the message queue, which read well again")
		}
		if err := s.cfg.Handler.Handle(ctx, s, msg); err != nil {
			s.cfg.Log.Warn().Err(err).Int("message", r.id).Int("scale_set", s.cfg.Set.ID).
				Msg("github: handling a message failed; it stays in the queue and is handled again")
			return s.cfg.Retry
		}
	}
	if err := s.client.DeleteMessage(ctx, r.id); err != nil {
		s.failed("acknowledge a message", err)
		return s.cfg.Retry
	}
	switch {
	case r.whole != nil:
		s.cfg.Metrics.Dropped.WithLabelValues(label).Inc()
	case len(r.bad) > 0:
		s.cfg.Metrics.Dropped.WithLabelValues(label).Add(float64(len(r.bad)))
	}
	s.last = r.id
	return 0
}

// maxMessage bounds a message read again by salvage.
const maxMessage = 16 << 20

// reread is a message of the queue as salvage read it: its id, what could be read of it
// (msg), the reason it is dropped whole, or the errors of the job messages dropped from its
// batch.
type reread struct {
	id    int
	msg   *scaleset.RunnerScaleSetMessage
	whole error
	bad   []error
}

// messageID finds a message's id in an envelope that is not JSON.
var messageID = regexp.MustCompile(`"messageId"\s*:\s*([0-9]+)`)

// reread reads the next message of the queue with a request of its own and parses it as far
// as it can; nil when the queue has none.
func (s *Session) reread(ctx context.Context) (*reread, error) {
	sess := s.client.Session()
	u, err := url.Parse(sess.MessageQueueURL)
	if err != nil {
		return nil, fmt.Errorf("message queue URL: %w", err)
	}
	if s.last > 0 {
		q := u.Query()
		q.Set("lastMessageId", strconv.Itoa(s.last))
		u.RawQuery = q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json; api-version=6.0-preview")
	req.Header.Set("Authorization", "Bearer "+sess.MessageQueueAccessToken)
	req.Header.Set(scaleset.HeaderScaleSetMaxCapacity, strconv.Itoa(max(s.cfg.Capacity(), 0)))
	resp, err := s.cfg.Clients.HTTP().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusAccepted:
		return nil, nil
	default:
		return nil, fmt.Errorf("read the message again: %s", resp.Status)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxMessage+1))
	if err != nil {
		return nil, fmt.Errorf("read the message again: %w", err)
	}
	if len(raw) > maxMessage {
		return nil, fmt.Errorf("read the message again: larger than %d bytes", maxMessage)
	}
	return parseLeniently(raw)
}

// parseLeniently parses a message of the queue as the client does, keeping what can be read:
// an error only when not even its id can be.
func parseLeniently(raw []byte) (*reread, error) {
	var env struct {
		MessageID   int             `json:"messageId"`
		MessageType string          `json:"messageType"`
		Body        json.RawMessage `json:"body"`
		Statistics  json.RawMessage `json:"statistics"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		m := messageID.FindSubmatch(raw)
		id, aerr := 0, errors.New("no messageId")
		if m != nil {
			id, aerr = strconv.Atoi(string(m[1]))
		}
		if aerr != nil || id <= 0 {
			return nil, fmt.Errorf("read the message's id: %w", errors.Join(err, aerr))
		}
		return &reread{id: id, whole: fmt.Errorf("the message is not JSON: %w", err)}, nil
	}
	if env.MessageID <= 0 {
		return nil, errors.New("read the message's id: no messageId")
	}
	r := &reread{id: env.MessageID, msg: &scaleset.RunnerScaleSetMessage{MessageID: env.MessageID}}
	if env.MessageType != "RunnerScaleSetJobMessages" {
		r.whole = fmt.Errorf("unsupported message type %q", env.MessageType)
		return r, nil
	}
	if len(env.Statistics) > 0 && string(env.Statistics) != "null" {
		var st scaleset.RunnerScaleSetStatistic
		if err := json.Unmarshal(env.Statistics, &st); err == nil {
			r.msg.Statistics = &st
		} else {
			r.bad = append(r.bad, fmt.Errorf("statistics: %w", err))
		}
	}
	var body string
	if len(env.Body) > 0 && string(env.Body) != "null" {
		if err := json.Unmarshal(env.Body, &body); err != nil {
			r.whole = fmt.Errorf("the body is not a JSON string: %w", err)
			return r, nil
		}
	}
	var batch []json.RawMessage
	if body != "" {
		if err := json.Unmarshal([]byte(body), &batch); err != nil {
			r.whole = fmt.Errorf("the body is not a JSON array of job messages: %w", err)
			return r, nil
		}
	}
	for i, jm := range batch {
		if err := addJobMessage(r.msg, jm); err != nil {
			r.bad = append(r.bad, fmt.Errorf("job message %d of the batch: %w", i, err))
		}
	}
	return r, nil
}

// addJobMessage decodes one job message of a batch into msg, as the client does; a type the
// client ignores is ignored.
func addJobMessage(msg *scaleset.RunnerScaleSetMessage, raw json.RawMessage) error {
	var t scaleset.JobMessageType
	if err := json.Unmarshal(raw, &t); err != nil {
		return fmt.Errorf("its type: %w", err)
	}
	var err error
	switch t.MessageType {
	case scaleset.MessageTypeJobAvailable:
		var m scaleset.JobAvailable
		if err = json.Unmarshal(raw, &m); err == nil {
			msg.JobAvailableMessages = append(msg.JobAvailableMessages, &m)
		}
	case scaleset.MessageTypeJobAssigned:
		var m scaleset.JobAssigned
		if err = json.Unmarshal(raw, &m); err == nil {
			msg.JobAssignedMessages = append(msg.JobAssignedMessages, &m)
		}
	case scaleset.MessageTypeJobStarted:
		var m scaleset.JobStarted
		if err = json.Unmarshal(raw, &m); err == nil {
			msg.JobStartedMessages = append(msg.JobStartedMessages, &m)
		}
	case scaleset.MessageTypeJobCompleted:
		var m scaleset.JobCompleted
		if err = json.Unmarshal(raw, &m); err == nil {
			msg.JobCompletedMessages = append(msg.JobCompletedMessages, &m)
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", t.MessageType, err)
	}
	return nil
}
