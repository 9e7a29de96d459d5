package eventlog

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// MinKeySize is the shortest record key Open accepts, in bytes.
const MinKeySize = 32

// HeaderMAC carries a message's authentication code: "v1." and the hex HMAC-SHA256, under the
// log's key, of the message's subject, its compare-and-swap headers and its body. A record
// without it, or whose code does not verify, was not written by a component holding the key.
const HeaderMAC = "Dynrunner-Mac"

// The headers of a quarantined message in DYNRUNNER_DEAD (SubjectQuarantine).
const (
	HeaderReason  = "Dynrunner-Reason"
	HeaderSubject = "Dynrunner-Subject"
	HeaderSeq     = "Dynrunner-Seq"
)

// SubjectQuarantine is where a record that was rejected is kept, with why, once it is removed
// from its stream.
const SubjectQuarantine = SubjectDead + "record"

var (
	// ErrRejected reports a message the log does not believe: ErrUnauthenticated or
	// ErrMalformed wrap it.
	ErrRejected = errors.New("record rejected")
	// ErrUnauthenticated: the message's MAC is missing or does not verify.
	ErrUnauthenticated = fmt.Errorf("not written with the event log's key: %w", ErrRejected)
	// ErrMalformed: the message is authentic but is not a record of the subject it is on.
	ErrMalformed = fmt.Errorf("malformed: %w", ErrRejected)
	// ErrShortKey: the key given to Open is shorter than MinKeySize.
	ErrShortKey = errors.New("eventlog: the record key is too short")
)

// Rejection is a message the log refused to believe, as reported to Config.OnReject.
type Rejection struct {
	Stream  string
	Subject string
	Seq     uint64
	// Err says why (errors.Is ErrUnauthenticated or ErrMalformed).
	Err error
	// Quarantined: the message was moved to SubjectQuarantine and removed from its stream.
	// QuarantineErr says why not, when it was not.
	Quarantined   bool
	QuarantineErr error
}

// macVersion prefixes every HeaderMAC value.
const macVersion = "v1."

// signer computes and checks MACs; its key is derived from Config.Key.
type signer struct{ key []byte }

func (s signer) sum(subject string, hdr nats.Header, data []byte) string {
	m := hmac.New(sha256.New, s.key)
	// Length-prefixed fields: no two different messages give one input.
	for _, f := range []string{"dynrunner-record-v1", subject,
		hdr.Get(jetstream.ExpectedLastSubjSeqHeader), hdr.Get(jetstream.ExpectedLastSubjSeqSubjHeader)} {
		fmt.Fprintf(m, "%d:%s|", len(f), f)
	}
	m.Write(data)
	return macVersion + hex.EncodeToString(m.Sum(nil))
}

// sign sets msg's MAC header; the compare-and-swap headers must be set before.
func (s signer) sign(msg *nats.Msg) {
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	msg.Header.Set(HeaderMAC, s.sum(msg.Subject, msg.Header, msg.Data))
}

// verify checks the MAC of a message read back from a stream.
func (s signer) verify(subject string, hdr nats.Header, data []byte) error {
	got := hdr.Get(HeaderMAC)
	if got == "" {
		return fmt.Errorf("eventlog: %s: no %s header: %w", subject, HeaderMAC, ErrUnauthenticated)
	}
	if !hmac.Equal([]byte(got), []byte(s.sum(subject, hdr, data))) {
		return fmt.Errorf("eventlog: %s: %s does not verify: %w", subject, HeaderMAC, ErrUnauthenticated)
	}
	return nil
}

// RecordSubject is the subject a transition of a task is appended to:
// dynrunner.assignment.<task_id>.<transition>. Each component may publish only the transitions
// it makes (docs/security.md, per-component NATS users); the compare-and-swap spans the task's
// subjects (Subject).
func RecordSubject(task assignment.TaskID, t assignment.Transition) string {
	return SubjectAssignment + task.String() + "." + string(t)
}

// parseRecordSubject reads the task and transition a record subject names.
func parseRecordSubject(subject string) (assignment.TaskID, assignment.Transition, error) {
	rest, ok := strings.CutPrefix(subject, SubjectAssignment)
	if !ok {
		return 0, "", fmt.Errorf("eventlog: %q is not an assignment subject: %w", subject, ErrMalformed)
	}
	ts, tr, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, "", fmt.Errorf("eventlog: %q names no transition: %w", subject, ErrMalformed)
	}
	task, err := assignment.ParseTaskID(ts)
	if err != nil {
		return 0, "", fmt.Errorf("eventlog: %q: %w: %w", subject, err, ErrMalformed)
	}
	return task, assignment.Transition(tr), nil
}

// decodeRecord verifies and decodes an assignment record read back from the stream. A record
// must carry a MAC that verifies, be on the subject of its own task and transition, and hold a
// valid state; anything else is rejected (ErrRejected) and must not be believed.
func (l *Log) decodeRecord(subject string, hdr nats.Header, data []byte, seq uint64) (assignment.State, error) {
	if err := l.sign.verify(subject, hdr, data); err != nil {
		return assignment.State{}, err
	}
	task, tr, err := parseRecordSubject(subject)
	if err != nil {
		return assignment.State{}, err
	}
	var rec assignment.Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return assignment.State{}, fmt.Errorf("eventlog: decode record %d: %w: %w", seq, err, ErrMalformed)
	}
	if rec.Task != task || rec.Transition != tr {
		return assignment.State{}, fmt.Errorf("eventlog: record %d on %s is the %s of task %d: %w", seq, subject, rec.Transition, rec.Task, ErrMalformed)
	}
	return assignment.State{Record: rec, Seq: seq}, nil
}

// quarantine removes a rejected message from its stream, keeping a copy with why in
// DYNRUNNER_DEAD, and reports it to Config.OnReject once per message and process. A message
// it may not remove (the NATS user lacks the permission) stays; readers skip it all the same.
func (l *Log) quarantine(ctx context.Context, stream jetstream.Stream, name, subject string, seq uint64, data []byte, cause error) {
	if !l.rejected.first(name, seq) {
		return
	}
	r := Rejection{Stream: name, Subject: subject, Seq: seq, Err: cause}
	msg := nats.NewMsg(SubjectQuarantine)
	msg.Data = data
	msg.Header.Set(HeaderReason, cause.Error())
	msg.Header.Set(HeaderSubject, subject)
	msg.Header.Set(HeaderSeq, strconv.FormatUint(seq, 10))
	msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("quarantine-%s-%d", name, seq))
	if int64(len(data)) > l.MaxPayload()-msgOverhead {
		msg.Data = nil // the copy would not fit beside its headers: keep where it was and why
	}
	if _, err := l.js.PublishMsg(ctx, msg); err != nil {
		r.QuarantineErr = fmt.Errorf("eventlog: keep the rejected message: %w", err)
	} else if err := stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		r.QuarantineErr = fmt.Errorf("eventlog: remove the rejected message from %s: %w", name, err)
	} else {
		r.Quarantined = true
	}
	if l.cfg.OnReject != nil {
		l.cfg.OnReject(r)
	}
}

// seen remembers which rejected messages were reported, so a message read again (its
// removal was refused) is reported once; bounded, it forgets everything when full.
type seen struct {
	mu  sync.Mutex
	set map[seenKey]struct{}
}

type seenKey struct {
	stream string
	seq    uint64
}

const maxSeen = 4096

func (s *seen) first(stream string, seq uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := seenKey{stream, seq}
	if _, ok := s.set[k]; ok {
		return false
	}
	if s.set == nil || len(s.set) >= maxSeen {
		s.set = make(map[seenKey]struct{})
	}
	s.set[k] = struct{}{}
	return true
}
