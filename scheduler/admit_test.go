package scheduler

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

var admitNow = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

// job is one live assignment of a table row: "a:q" is a queued claim of owner a, "a:r" one in
// flight, "a:f" a failed one; the order of the row is the order of the claims.
func jobs(specs ...string) []assignment.State {
	var live []assignment.State
	for i, s := range specs {
		owner, kind := s[:len(s)-2], s[len(s)-1:]
		st := assignment.State{Seq: uint64(i + 1), Record: assignment.Record{
			Transition: assignment.Claimed, Task: assignment.TaskID(i + 1), Backend: assignment.BackendPod,
			Repo: owner + "/repo", QueueDeadline: admitNow.Add(time.Minute),
		}}
		switch kind {
		case "q":
			st.Phase = assignment.Queued
		case "r":
			st.Phase = assignment.Running
		case "f":
			st.Phase = assignment.Failed
		case "x": // queued past its deadline
			st.Phase, st.QueueDeadline = assignment.Queued, admitNow.Add(-time.Second)
		}
		live = append(live, st)
	}
	return live
}

func owners(sts []assignment.State) []string {
	var out []string
	for _, st := range sts {
		out = append(out, fmt.Sprintf("%s#%d", st.Owner(), st.Task))
	}
	return out
}

func TestPlanAdmit(t *testing.T) {
	fifo := Admission{MaxQueued: 10, Queue: time.Hour}
	fair := Admission{MaxQueued: 10, Queue: time.Hour, Fairness: FairnessOwner}
	for _, tc := range []struct {
		name     string
		live     []assignment.State
		capacity int
		adm      Admission
		want     []string
	}{
		{"no queue admits nothing", jobs("a:q"), 2, Admission{}, nil},
		{"full tier admits nothing", jobs("a:r", "a:r", "b:q"), 2, fair, nil},
		{"fifo admits the oldest", jobs("a:r", "a:q", "a:q", "b:q"), 2, fifo, []string{"a#2"}},
		{"fifo fills every free slot in claim order", jobs("a:q", "a:q", "b:q"), 2, fifo, []string{"a#1", "a#2"}},
		{"a failed assignment holds no slot", jobs("a:f", "a:f", "a:q"), 2, fifo, []string{"a#3"}},
		{"owner fairness: the owner holding fewer goes first", jobs("a:r", "a:q", "a:q", "b:q"), 2, fair, []string{"b#4"}},
		{"owner fairness alternates over the free slots", jobs("a:q", "a:q", "a:q", "b:q", "b:q"), 4, fair,
			[]string{"a#1", "b#4", "a#2", "b#5"}},
		{"owner fairness between equals takes the older claim", jobs("b:r", "a:r", "b:q", "a:q"), 3, fair, []string{"b#3"}},
		{"share cap skips the owner at its cap", jobs("a:r", "a:q", "b:q"), 4, Admission{MaxQueued: 10, ShareCap: 1}, []string{"b#3"}},
		{"share cap leaves slots free rather than exceed it", jobs("a:r", "a:q", "a:q"), 4, Admission{MaxQueued: 10, ShareCap: 2}, []string{"a#2"}},
		{"claims past their queue deadline are not admitted", jobs("a:x", "b:q"), 2, fifo, []string{"b#2"}},
		{"scale to zero: nothing live, nothing admitted", nil, 2, fair, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planAdmit(slices.Values(tc.live), map[assignment.Backend]int{assignment.BackendPod: tc.capacity}, tc.adm, admitNow)
			assert.Equal(t, tc.want, owners(got))
		})
	}
}

func TestQueueOnClaimAndPause(t *testing.T) {
	capacity := map[assignment.Backend]int{assignment.BackendPod: 2}
	backends := []assignment.Backend{assignment.BackendPod}
	adm := Admission{MaxQueued: 2, ShareCap: 1}
	pod := assignment.BackendPod

	// Without a queue: never queued; fetching pauses while the tier is full.
	require.False(t, queueOnClaim(tally(jobs("a:r", "a:r")), capacity, Admission{}, pod, "b"))
	require.True(t, paused(tally(jobs("a:r", "a:r")), capacity, backends, Admission{}))
	require.False(t, paused(tally(jobs("a:r")), capacity, backends, Admission{}))

	// With one: a claim queues when the tier is full, when others wait, or at the share cap.
	require.False(t, queueOnClaim(tally(jobs("a:r")), capacity, adm, pod, "b"), "a claim with a free slot queued")
	require.True(t, queueOnClaim(tally(jobs("a:r", "b:r")), capacity, adm, pod, "c"), "a claim for a full tier did not queue")
	require.True(t, queueOnClaim(tally(jobs("c:q")), capacity, adm, pod, "b"), "a claim jumped the queue")
	require.True(t, queueOnClaim(tally(jobs("a:r")), capacity, adm, pod, "a"), "a claim past the share cap did not queue")
	require.False(t, paused(tally(jobs("a:r", "b:r", "c:q")), capacity, backends, adm), "paused with room in the queue")
	require.True(t, paused(tally(jobs("a:r", "b:r", "c:q", "d:q")), capacity, backends, adm), "fetching with MAX_QUEUED waiting")
}

func TestParseFairness(t *testing.T) {
	for in, want := range map[string]Fairness{"": FairnessFIFO, "fifo": FairnessFIFO, "owner": FairnessOwner, "OWNER": FairnessOwner} {
		got, err := ParseFairness(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := ParseFairness("repo")
	require.ErrorContains(t, err, "want owner")
}

func TestOwnerLabelsAreBounded(t *testing.T) {
	var o ownerLabels
	for i := range MaxOwnerLabels {
		require.Equal(t, fmt.Sprint("o", i), o.label(fmt.Sprint("o", i)))
	}
	require.Equal(t, OtherOwners, o.label("late"))
	require.Equal(t, "o3", o.label("o3"), "a known owner lost its label")
}

// tally counts a list of states as the reconcile pass counts the view's.
func tally(live []assignment.State) load { return count(slices.Values(live), true) }
