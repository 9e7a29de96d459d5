package facade

import (
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// The facade's decisions about a caller's assignment are pure functions of what Facade.load
// read: checkAssignment (is it the caller's?), checkRunner, checkRegister, checkReporting,
// planFetch and planRenew. The handlers read, ask the check, and answer.

// verdict is a check's answer when the request cannot go on: the error to answer with. A
// refusal (reason set) is counted in the refused metric under reason and logged (Facade.refuse);
// any other verdict is answered as it is.
type verdict struct {
	reason string
	code   connect.Code
	err    error
}

// answer turns v into the error the handler returns.
func (f *Facade) answer(v *verdict) error {
	if v.reason != "" {
		return f.refuse(v.reason, v.code, v.err)
	}
	return connect.NewError(v.code, v.err)
}

// checkAssignment checks st, the assignment c's task has as read with error err, is c's: the
// task has one, c's epoch is current, and a guest asks only about a vm assignment.
func checkAssignment(c caller, st assignment.State, err error) *verdict {
	switch {
	case errors.Is(err, assignment.ErrNotFound):
		return &verdict{"unknown_assignment", connect.CodeNotFound, fmt.Errorf("dynrunner facade: task %d has no assignment", c.task)}
	case err != nil:
		return &verdict{code: connect.CodeUnavailable, err: err}
	case c.guest && st.Backend != assignment.BackendVM:
		return &verdict{"guest_for_pod", connect.CodePermissionDenied,
			fmt.Errorf("dynrunner facade: task %d runs in a %s environment, which must present its SPIFFE identity", c.task, st.Backend)}
	case st.Epoch() != c.epoch:
		return &verdict{"stale_epoch", connect.CodeFailedPrecondition,
			fmt.Errorf("dynrunner facade: task %d: epoch %d is stale, the current epoch is %d: %w", c.task, c.epoch, st.Epoch(), assignment.ErrStaleEpoch)}
	}
	return nil
}

// checkRunner checks that uuid is the runner registered for st, and that its credentials have
// not ended with the lease (leaseOver, Facade.leaseOver).
func checkRunner(c caller, st assignment.State, uuid string, leaseOver bool) *verdict {
	if st.RunnerUUID != uuid {
		return &verdict{"bad_runner_token", connect.CodePermissionDenied,
			fmt.Errorf("dynrunner facade: runner %s is not the one registered for task %d", uuid, c.task)}
	}
	if leaseOver {
		return &verdict{"lease_expired", connect.CodeUnauthenticated,
			fmt.Errorf("dynrunner facade: the runner credentials of task %d expired with its lease at %s", c.task, st.LeaseExpires.UTC().Format(time.RFC3339))}
	}
	return nil
}

// checkRegister checks the environment's start is recorded, so it may register: an environment
// faster than its worker's `started` record is asked to retry.
func checkRegister(c caller, st assignment.State) *verdict {
	if st.Phase == assignment.Claimed || st.Phase == assignment.Dispatched {
		return &verdict{code: connect.CodeUnavailable, err: fmt.Errorf("dynrunner facade: task %d: the environment's start is not recorded yet; retry", c.task)}
	}
	return nil
}

// checkReporting lets a report through only while the assignment runs: the forge hears nothing
// in an environment's name, with the resident runner's credentials, once its job has ended
// (completed, failed or closed) — not a late log, not a second final state with other outputs.
// A retried final report whose first answer was lost is refused too: the forge has it.
func checkReporting(c caller, st assignment.State) *verdict {
	switch st.Phase {
	case assignment.Running:
		return nil
	case assignment.Completed, assignment.Failed, assignment.Closed:
		return &verdict{"ended", connect.CodeFailedPrecondition,
			fmt.Errorf("dynrunner facade: task %d has %s; nothing more is forwarded for it", c.task, st.Phase)}
	}
	return &verdict{code: connect.CodeFailedPrecondition, err: fmt.Errorf("dynrunner facade: task %d is %s, not running", c.task, st.Phase)}
}

// fetchAction is what FetchTask answers a runner.
type fetchAction int

const (
	// fetchNothing: the assignment ended (or the runner fetches early); an empty answer.
	fetchNothing fetchAction = iota + 1
	// fetchHand: hand the task over and record `running`.
	fetchHand
	// fetchAgain: handed over already, to this very runner (checkRunner): its first answer was
	// lost (a timeout, a controller restart). Hand it the same task again; no other runner
	// holds these credentials.
	fetchAgain
)

// planFetch decides what FetchTask answers the registered runner of st.
func planFetch(st assignment.State) fetchAction {
	switch st.Phase {
	case assignment.Registered:
		return fetchHand
	case assignment.Running:
		return fetchAgain
	}
	return fetchNothing
}

// planRenew decides a renewal of st's lease: ended when the assignment ended or failed (the
// environment is to stop), else a verdict when the lease is over (leaseOver, Facade.leaseOver)
// and cannot be renewed, else nil: renew.
func planRenew(c caller, st assignment.State, leaseOver bool) (ended bool, v *verdict) {
	if !st.Active() {
		return true, nil
	}
	if leaseOver {
		return false, &verdict{"lease_expired", connect.CodeFailedPrecondition,
			fmt.Errorf("dynrunner facade: the lease of task %d ended at %s; it cannot be renewed", c.task, st.LeaseExpires.UTC().Format(time.RFC3339))}
	}
	return false, nil
}
