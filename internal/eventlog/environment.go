package eventlog

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Phases of an environment in its records: the Kubernetes Pod phases, and Deleted.
const (
	EnvPending   = "Pending"
	EnvRunning   = "Running"
	EnvSucceeded = "Succeeded"
	EnvFailed    = "Failed"
	// EnvDeleted: the environment was deleted while it was watched (it is gone, was replaced,
	// or ended because its deletion was requested).
	EnvDeleted = "Deleted"
)

// Bounds of an EnvironmentRecord's free-text fields, in bytes; longer values are cut.
const (
	maxEnvReason  = 128
	maxEnvMessage = 512
)

// EnvironmentRecord is one observation of an assignment's environment, appended to
// DYNRUNNER_ENVIRONMENTS: a phase the backend saw its environment reach. It never holds
// secrets: Reason and Message come from the cluster (the kubelet, controllers), never from the
// job.
type EnvironmentRecord struct {
	Task  assignment.TaskID `json:"task_id"`
	Epoch assignment.Epoch  `json:"epoch"`
	// Backend is the backend that runs the environment (the handle's backend, "kubernetes").
	Backend string `json:"backend"`
	// Env is the handle's id: the Pod's name.
	Env    string `json:"env"`
	PodUID string `json:"pod_uid,omitempty"`
	// Phase is one of the Env* constants.
	Phase   string `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	Node    string `json:"node,omitempty"`
	// At is when the phase was observed.
	At    time.Time `json:"at"`
	Actor string    `json:"actor"`
}

// EnvironmentSubject returns the environment subject of a task.
func EnvironmentSubject(task assignment.TaskID) string { return SubjectEnvironment + task.String() }

// RecordEnvironment appends rec to the task's environment subject, cutting Reason and Message to
// a few hundred bytes. The message id env-<task>-<epoch>-<pod uid>-<phase> makes the stream
// drop a repeat within its two-minute duplicate window (a Wait resumed after a restart reports
// the current phase again).
func (l *Log) RecordEnvironment(ctx context.Context, rec EnvironmentRecord) error {
	if rec.Task <= 0 || rec.Epoch == 0 {
		return fmt.Errorf("eventlog: environment record without task id or epoch: %w", assignment.ErrInvalidID)
	}
	if rec.Env == "" || rec.Phase == "" || rec.At.IsZero() {
		return fmt.Errorf("eventlog: environment record for task %d without env, phase or time", rec.Task)
	}
	rec.At = rec.At.UTC()
	rec.Reason = truncate(rec.Reason, maxEnvReason)
	rec.Message = truncate(rec.Message, maxEnvMessage)
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("eventlog: encode environment record: %w", err)
	}
	msg := nats.NewMsg(EnvironmentSubject(rec.Task))
	msg.Data = data
	msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("env-%d-%d-%s-%s", rec.Task, rec.Epoch, rec.PodUID, rec.Phase))
	l.sign.sign(msg)
	if _, err := l.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("eventlog: record %s of %s for task %d: %w", rec.Phase, rec.Env, rec.Task, err)
	}
	return nil
}

// truncate cuts s to at most n bytes without splitting a UTF-8 sequence, marking the cut
// with "…".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
