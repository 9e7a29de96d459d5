package kube

import (
	"cmp"
	"context"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"

	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/podworker"
)

// PhaseDeleted is the PhaseChange.Phase of a Pod deleted while Wait watched it.
const PhaseDeleted = "Deleted"

// reasonReplaced is the PhaseChange.Reason of a Pod that a newer one of the same name replaced.
const reasonReplaced = "Replaced"

// PhaseChange is a phase an environment's Pod reached, as Wait saw it. Wait reports the first
// phase it sees and then every different one, in order: the Pod's phase (Pending, Running,
// Succeeded, Failed, or Unknown while its node is unreachable), and PhaseDeleted when the Pod is
// gone, was replaced by a newer Pod of the same name, or ended because it was being deleted.
// Each Wait call reports afresh, so a Wait resumed after a restart reports the current phase
// again.
type PhaseChange struct {
	// UID is the Pod's UID.
	UID string
	// Phase is the Pod's phase or PhaseDeleted.
	Phase string
	// Reason and Message say why, in the words of the cluster (the kubelet, controllers), never
	// the job's: the Pod status's reason and message ("Evicted", "DeadlineExceeded"), else the
	// executor container's waiting reason and message ("ErrImagePull") or its terminated reason
	// ("Completed", "Error", "OOMKilled"; never its termination message, which the job writes),
	// else those of an unmet PodScheduled condition ("Unschedulable").
	Reason, Message string
	// Node is the node the Pod is bound to ("" before it is scheduled).
	Node string
}

// phases tracks what one Wait call has reported to Config.OnPhase.
type phases struct {
	fn   func(context.Context, podworker.Handle, PhaseChange)
	h    podworker.Handle
	uid  string // the handle's Pod UID, or that of the Pod Wait saw
	node string
	last string
}

// saw reports pod's phase, if it changed.
func (p *phases) saw(ctx context.Context, pod *corev1.Pod) {
	p.uid = cmp.Or(string(pod.UID), p.uid)
	p.node = cmp.Or(pod.Spec.NodeName, p.node)
	if pod.Status.Phase == "" {
		return
	}
	reason, msg := statusWords(pod)
	p.report(ctx, PhaseChange{UID: p.uid, Phase: string(pod.Status.Phase), Reason: reason, Message: msg, Node: p.node})
}

// ended reports the deletion of a Pod that ended while it was being deleted: nothing keeps it.
func (p *phases) ended(ctx context.Context, pod *corev1.Pod) {
	if pod.DeletionTimestamp != nil {
		p.gone(ctx, "")
	}
}

// gone reports the deletion of the Pod; reason is reasonReplaced or "".
func (p *phases) gone(ctx context.Context, reason string) {
	c := PhaseChange{UID: p.uid, Phase: PhaseDeleted, Node: p.node, Reason: reason}
	if reason == reasonReplaced {
		c.Message = "a newer Pod of the same name replaced it"
	}
	p.report(ctx, c)
}

func (p *phases) report(ctx context.Context, c PhaseChange) {
	if p.fn == nil || c.Phase == p.last {
		return
	}
	p.last = c.Phase
	p.fn(ctx, p.h, c)
}

// statusWords returns the reason and message of pod's status that PhaseChange documents.
func statusWords(pod *corev1.Pod) (reason, message string) {
	if pod.Status.Reason != "" || pod.Status.Message != "" {
		return pod.Status.Reason, pod.Status.Message
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != ContainerName {
			continue
		}
		if w := cs.State.Waiting; w != nil {
			return w.Reason, w.Message
		}
		if t := cs.State.Terminated; t != nil {
			return t.Reason, ""
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Reason, c.Message
		}
	}
	return "", ""
}

// phaseRecordTimeout bounds the append of one Pod phase: Wait waits for it.
const phaseRecordTimeout = 2 * time.Second

// EnvironmentRecorder appends environment records; *eventlog.Log is one.
type EnvironmentRecorder interface {
	RecordEnvironment(ctx context.Context, rec eventlog.EnvironmentRecord) error
}

var _ EnvironmentRecorder = (*eventlog.Log)(nil)

// RecordPhases returns a Config.OnPhase that appends each Pod phase to the event log's
// environment stream as actor, at now. A failed append is logged and otherwise ignored: the
// records are an audit trail, never an input to the assignment's state machine.
func RecordPhases(rec EnvironmentRecorder, actor string, now func() time.Time, log zerolog.Logger) func(context.Context, podworker.Handle, PhaseChange) {
	return func(ctx context.Context, h podworker.Handle, c PhaseChange) {
		l := log.With().Str(logkey.Env, h.ID).Int64(logkey.TaskID, int64(h.Task)).Uint64(logkey.Epoch, uint64(h.Epoch)).
			Str(logkey.PodUID, c.UID).Str(logkey.Phase, c.Phase).Logger()
		l.Debug().Str("reason", c.Reason).Str("node", c.Node).Msg("pod phase")
		rctx, cancel := context.WithTimeout(ctx, phaseRecordTimeout)
		defer cancel()
		err := rec.RecordEnvironment(rctx, eventlog.EnvironmentRecord{
			Task: h.Task, Epoch: h.Epoch, Backend: h.Backend, Env: h.ID, PodUID: c.UID, Phase: c.Phase,
			Reason: c.Reason, Message: c.Message, Node: c.Node, At: now(), Actor: actor,
		})
		if err != nil && ctx.Err() == nil {
			l.Warn().Err(err).Msg("could not record the pod phase in the event log")
		}
	}
}
