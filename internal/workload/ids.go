package workload

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// ErrNotAssignment reports a SPIFFE ID that is not an assignment identity of the expected
// trust domain.
var ErrNotAssignment = errors.New("not an assignment identity")

const (
	rootSegment   = "dynrunner"
	taskSegment   = "task"
	epochSegment  = "epoch"
	facadeSegment = "facade"
)

// AssignmentID returns spiffe://<td>/dynrunner/task/<task>/epoch/<epoch>. It returns the
// zero ID, which authorizes nothing, if td is zero or task or epoch is not positive.
func AssignmentID(td spiffeid.TrustDomain, task assignment.TaskID, epoch assignment.Epoch) spiffeid.ID {
	if task <= 0 || epoch == 0 {
		return spiffeid.ID{}
	}
	id, err := spiffeid.FromSegments(td, rootSegment, taskSegment, task.String(), epochSegment, epoch.String())
	if err != nil {
		return spiffeid.ID{}
	}
	return id
}

// ParseAssignmentID returns the task and epoch of an assignment identity made by
// AssignmentID in trust domain td. Any other ID (another trust domain, another path, a
// non-canonical number) fails with ErrNotAssignment.
func ParseAssignmentID(id spiffeid.ID, td spiffeid.TrustDomain) (assignment.TaskID, assignment.Epoch, error) {
	fail := func(why string) (assignment.TaskID, assignment.Epoch, error) {
		return 0, 0, fmt.Errorf("workload: %q: %s: %w", id.String(), why, ErrNotAssignment)
	}
	if id.IsZero() || td.IsZero() {
		return fail("no identity")
	}
	if !id.MemberOf(td) {
		return fail("trust domain is not " + td.Name())
	}
	seg := strings.Split(id.Path(), "/")
	// seg[0] is the empty string before the leading slash.
	if len(seg) != 6 || seg[0] != "" || seg[1] != rootSegment || seg[2] != taskSegment || seg[4] != epochSegment {
		return fail("path is not /" + rootSegment + "/" + taskSegment + "/<task>/" + epochSegment + "/<epoch>")
	}
	task, err := assignment.ParseTaskID(seg[3])
	if err != nil {
		return fail("bad task id")
	}
	epoch, err := assignment.ParseEpoch(seg[5])
	if err != nil {
		return fail("bad epoch")
	}
	return task, epoch, nil
}

// FacadeID returns spiffe://<td>/dynrunner/facade, or the zero ID if td is zero.
func FacadeID(td spiffeid.TrustDomain) spiffeid.ID {
	id, err := spiffeid.FromSegments(td, rootSegment, facadeSegment)
	if err != nil {
		return spiffeid.ID{}
	}
	return id
}
