package podworker

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
)

// The worker's decisions are pure functions over what it read: planDispatch for a dispatch
// message, planRetry for a failed attempt, startRefused for a refused `started` record and
// planSweep for an environment the backend lists. Worker.handle and Worker.sweep read, ask the
// plan, and carry it out.

// dispatchSnapshot is what the worker read for one dispatch message.
type dispatchSnapshot struct {
	// parseErr is why the message is not a valid dispatch (unsigned, malformed); nothing else
	// was read then.
	parseErr error
	d        eventlog.DispatchMsg
	// st is the assignment of d.Task: the view's, or JetStream's when the view does not know
	// d's epoch.
	st assignment.State
	// readErr is the error reading st from JetStream; it wraps assignment.ErrNotFound when the
	// task has no assignment.
	readErr error
	// refused is why this worker must not run st (its grant does not cover its tier); nil
	// when it may.
	refused error
	// delivered is the message's delivery count; deliveredOK is false when the message's
	// metadata could not be read.
	delivered   uint64
	deliveredOK bool
}

// dispatchKind is what the worker does with a dispatch message.
type dispatchKind int

const (
	// dispatchPoison: the message is not a valid dispatch; dead-letter it.
	dispatchPoison dispatchKind = iota + 1
	// dispatchOrphan: the task has no assignment; dead-letter it.
	dispatchOrphan
	// dispatchRetry: the assignment could not be read; retry the message (planRetry).
	dispatchRetry
	// dispatchDrop: the dispatch is no longer current (another epoch; the assignment ended
	// or failed); acknowledge it and do nothing.
	dispatchDrop
	// dispatchRefuse: the assignment's grant does not cover its tier; fail it, start nothing.
	dispatchRefuse
	// dispatchAdopt: the environment was started and recorded before (a crash lost the
	// acknowledgement); reserve the task and adopt it, unless another worker watches it.
	dispatchAdopt
	// dispatchStart: reserve the task, record `dispatched`, start the environment and record
	// `started`.
	dispatchStart
)

// dispatchAction is planDispatch's answer.
type dispatchAction struct {
	kind dispatchKind
	// reason is the dead-letter reason (poison, orphan), or why the assignment is refused.
	reason string
	// cause is the error to retry on (retry).
	cause error
	// handle is the recorded environment (adopt).
	handle Handle
	// destroyUnrecorded (start): the message was delivered before, and that attempt may have
	// started an environment holding a token other than the one about to be recorded;
	// destroy the environments of the task and epoch first.
	destroyUnrecorded bool
}

// planDispatch decides what to do with a dispatch message.
func planDispatch(s dispatchSnapshot) dispatchAction {
	if s.parseErr != nil {
		return dispatchAction{kind: dispatchPoison, reason: s.parseErr.Error()}
	}
	if errors.Is(s.readErr, assignment.ErrNotFound) {
		return dispatchAction{kind: dispatchOrphan, reason: "no assignment for the task"}
	}
	if s.readErr != nil {
		return dispatchAction{kind: dispatchRetry, cause: s.readErr}
	}
	if s.st.Epoch() != s.d.Epoch || !s.st.Active() {
		return dispatchAction{kind: dispatchDrop}
	}
	if s.refused != nil {
		// Before adopting too: an environment started under an older policy is not kept.
		return dispatchAction{kind: dispatchRefuse, reason: s.refused.Error()}
	}
	if len(s.st.Handle) > 0 {
		// Started before a crash: adopt the environment. A handle that does not decode is
		// started again.
		var h Handle
		if err := json.Unmarshal(s.st.Handle, &h); err == nil {
			return dispatchAction{kind: dispatchAdopt, handle: h}
		}
	}
	return dispatchAction{kind: dispatchStart, destroyUnrecorded: s.deliveredOK && s.delivered > 1}
}

// retryAction is planRetry's answer: nak the message with delay, or give up.
type retryAction struct {
	// giveUp: the message was delivered for the last time (or its delivery count is unknown);
	// fail the assignment and dead-letter the message.
	giveUp bool
	delay  time.Duration
}

// planRetry decides how a message whose handling failed is retried: redelivered after
// base times its delivery count, until maxDeliver deliveries.
func planRetry(delivered uint64, deliveredOK bool, maxDeliver uint64, base time.Duration) retryAction {
	if deliveredOK && delivered < maxDeliver {
		return retryAction{delay: time.Duration(delivered) * base}
	}
	return retryAction{giveUp: true}
}

// startRefused reports whether err, the refusal of a `started` record, says the assignment
// moved on (another epoch; it ended or failed): the message is done with. Any other error is
// retried.
func startRefused(err error) bool {
	return errors.Is(err, assignment.ErrStaleEpoch) || errors.Is(err, assignment.ErrTerminal) || errors.Is(err, assignment.ErrInvalidTransition)
}

// sweepEnv is what the sweep read about one environment the backend lists, when its turn came.
type sweepEnv struct {
	h Handle
	// mine: this worker watches an environment of the task, or a dispatch of it is starting
	// or adopting one.
	mine bool
	// st is the task's assignment as the view has it; known is false when the view has none.
	st    assignment.State
	known bool
}

// sweepAction is what the sweep does with an environment.
type sweepAction int

const (
	// sweepMine: this worker has the task already; leave the environment.
	sweepMine sweepAction = iota + 1
	// sweepAdopt: the live assignment records this environment; adopt it unless another
	// worker watches it.
	sweepAdopt
	// sweepYoung: the live assignment of the environment's epoch has no `started` record yet;
	// the environment may belong to a start whose record is being written. Leave it.
	sweepYoung
	// sweepReap: no live assignment owns the environment; destroy it.
	sweepReap
)

// planSweep decides what the sweep does with one environment.
func planSweep(e sweepEnv) sweepAction {
	switch {
	case e.mine:
		return sweepMine
	case !e.known || !e.st.Active() || e.st.Epoch() != e.h.Epoch:
		return sweepReap
	case len(e.st.Handle) == 0:
		return sweepYoung
	case handleID(e.st.Handle) == e.h.ID:
		return sweepAdopt
	}
	return sweepReap
}

func handleID(raw json.RawMessage) string {
	var h Handle
	_ = json.Unmarshal(raw, &h)
	return h.ID
}

// lostEnvironment reports whether an environment that ended before its job completed was lost
// (evicted, deleted, killed, disappeared, or its runner died) rather than ended by its job
// exceeding the environment's limits: its memory ("oom") or its deadline ("deadline"). A
// GitHub slot whose environment was lost has its job run again (forge/github, Reruns).
func lostEnvironment(exit Exit) bool { return exit.Reason != ExitOOM && exit.Reason != ExitDeadline }
