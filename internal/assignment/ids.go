package assignment

import (
	"errors"
	"fmt"
	"strconv"
)

// TaskID is the forge's task id (Gitea's runnerv1.Task.Id). It is always positive.
type TaskID int64

// ParseTaskID parses a decimal, positive task id.
func ParseTaskID(s string) (TaskID, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || strconv.FormatInt(n, 10) != s {
		return 0, fmt.Errorf("assignment: task id %q: %w", s, ErrInvalidID)
	}
	return TaskID(n), nil
}

func (t TaskID) String() string { return strconv.FormatInt(int64(t), 10) }

// Epoch is the fencing epoch of an assignment: the JetStream stream sequence of the append that
// handed the assignment over (its claim, or a reclaim). Lease renewals keep it. Zero is no epoch.
type Epoch uint64

// ParseEpoch parses a decimal, positive epoch.
func ParseEpoch(s string) (Epoch, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != s {
		return 0, fmt.Errorf("assignment: epoch %q: %w", s, ErrInvalidID)
	}
	return Epoch(n), nil
}

func (e Epoch) String() string { return strconv.FormatUint(uint64(e), 10) }

// ErrInvalidID reports a task id or epoch that does not parse.
var ErrInvalidID = errors.New("invalid identifier")
