package github

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

var r0 = time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)

const (
	slotA = assignment.SlotBase + 1
	slotB = assignment.SlotBase + 2
)

func note(slot assignment.TaskID, runningAt time.Time, at time.Time) rerunEvent {
	return rerunEvent{kind: rerunNote, actor: "s1", at: at, slot: slot, repo: "octo/app", run: 9, runningAt: runningAt}
}

// step applies evs in order, each of which must apply.
func step(t *testing.T, cur *Rerun, evs ...rerunEvent) *Rerun {
	t.Helper()
	for _, ev := range evs {
		next, err := decideRerun(cur, ev)
		require.NoError(t, err, "change %d", ev.kind)
		cur = &next
	}
	return cur
}

// TestRerunRound: a loss is noted pending, its run's attempt observed, the call claimed by one
// scheduler and recorded asked, counting the rerun; a second claim while the first holds is
// refused, and taken over once it ran out.
func TestRerunRound(t *testing.T) {
	r := step(t, nil, note(slotA, r0, r0.Add(time.Minute)))
	assert.Equal(t, RerunPending, r.State)
	assert.Equal(t, []assignment.TaskID{slotA}, r.Slots)
	assert.Equal(t, "octo/app", r.Repo)
	r = step(t, r, rerunEvent{kind: rerunObserve, attempt: 1, at: r0.Add(2 * time.Minute)})
	assert.Equal(t, 1, r.Attempt)
	_, err := decideRerun(r, rerunEvent{kind: rerunObserve, attempt: 2})
	require.ErrorIs(t, err, errRerunNoChange, "the attempt of the loss was overwritten")

	claimAt := r0.Add(20 * time.Minute)
	r = step(t, r, rerunEvent{kind: rerunClaim, actor: "s1", at: claimAt, attempt: 1, hold: time.Minute})
	assert.Equal(t, RerunAsking, r.State)
	assert.Equal(t, "s1", r.Asker)
	assert.Equal(t, claimAt, r.DecidedAt)
	_, err = decideRerun(r, rerunEvent{kind: rerunClaim, actor: "s2", at: claimAt.Add(30 * time.Second), attempt: 1, hold: time.Minute})
	require.ErrorIs(t, err, errRerunClaimed, "a second scheduler claimed a call that is claimed")
	taken := step(t, r, rerunEvent{kind: rerunClaim, actor: "s2", at: claimAt.Add(time.Minute), attempt: 1, hold: time.Minute})
	assert.Equal(t, "s2", taken.Asker)
	assert.Equal(t, claimAt, taken.DecidedAt, "a takeover moved the round's decision")

	r = step(t, r, rerunEvent{kind: rerunAsked, actor: "s1", at: claimAt.Add(time.Second)})
	assert.Equal(t, RerunAsked, r.State)
	assert.Equal(t, OutcomeRerun, r.Outcome)
	assert.Equal(t, 1, r.Reruns)
	assert.True(t, r.Final())
}

// TestRerunNotes: a slot noted again changes nothing; a loss whose job started before the
// round was decided belongs to it; one after begins the next round, keeping the count; while
// the call is claimed, such a loss waits; a loss of another run or repository is refused.
func TestRerunNotes(t *testing.T) {
	r := step(t, nil, note(slotA, r0, r0))
	_, err := decideRerun(r, note(slotA, r0, r0.Add(time.Minute)))
	require.ErrorIs(t, err, errRerunNoChange)
	r = step(t, r, note(slotB, r0.Add(time.Second), r0.Add(time.Minute)))
	assert.Equal(t, []assignment.TaskID{slotA, slotB}, r.Slots)

	claimAt := r0.Add(20 * time.Minute)
	asking := step(t, r, rerunEvent{kind: rerunClaim, actor: "s1", at: claimAt, attempt: 1, hold: time.Minute})
	_, err = decideRerun(asking, note(slotA+10, claimAt.Add(time.Second), claimAt.Add(time.Minute)))
	require.ErrorIs(t, err, errRerunBusy, "a loss of the rerun's attempt joined the round being asked for")
	late := step(t, asking, note(slotA+11, r0.Add(time.Minute), claimAt.Add(time.Second)))
	assert.Equal(t, RerunAsking, late.State, "a late loss of the asked attempt changed the round")

	asked := step(t, asking, rerunEvent{kind: rerunAsked, actor: "s1", at: claimAt})
	same := step(t, asked, note(slotA+12, r0.Add(2*time.Minute), claimAt.Add(time.Hour)))
	assert.Equal(t, RerunAsked, same.State, "a loss of the attempt already rerun began another round")
	next := step(t, asked, note(slotA+13, claimAt.Add(time.Minute), claimAt.Add(time.Hour)))
	assert.Equal(t, RerunPending, next.State, "a loss in the rerun's attempt began no round")
	assert.Equal(t, 1, next.Reruns, "the next round forgot the reruns asked")
	assert.Zero(t, next.Attempt)
	assert.Zero(t, next.DecidedAt)
	assert.Empty(t, next.Outcome)

	bad := note(slotA+14, r0, r0)
	bad.repo = "octo/other"
	_, err = decideRerun(r, bad)
	require.ErrorIs(t, err, errRerunInvalid)
	bad = note(slotA+14, r0, r0)
	bad.run = 10
	_, err = decideRerun(r, bad)
	require.ErrorIs(t, err, errRerunInvalid)
	_, err = decideRerun(nil, rerunEvent{kind: rerunNote, slot: slotA, run: 9, repo: "octo/app"})
	require.ErrorIs(t, err, errRerunInvalid, "a loss without its job's start was noted")

	many := step(t, nil, note(slotA, r0, r0))
	for i := range rerunMaxSlots + 5 {
		many = step(t, many, note(slotB+assignment.TaskID(i), r0, r0))
	}
	assert.Len(t, many.Slots, rerunMaxSlots)
}

// TestRerunFailures: a failed call returns the round to pending, counting the try; the last
// try gives up.
func TestRerunFailures(t *testing.T) {
	r := step(t, nil, note(slotA, r0, r0))
	claim := rerunEvent{kind: rerunClaim, actor: "s1", at: r0.Add(time.Hour), attempt: 1, hold: time.Minute}
	for i := 1; i < 3; i++ {
		r = step(t, r, claim, rerunEvent{kind: rerunFail, actor: "s1", at: claim.at, err: "502", maxTries: 3})
		assert.Equal(t, RerunPending, r.State)
		assert.Equal(t, i, r.Tries)
		claim.at = claim.at.Add(time.Hour)
	}
	r = step(t, r, claim, rerunEvent{kind: rerunFail, actor: "s1", at: claim.at, err: "502", maxTries: 3})
	assert.Equal(t, RerunSkipped, r.State)
	assert.Equal(t, OutcomeGaveUp, r.Outcome)
	assert.Contains(t, r.Reason, "502")

	_, err := decideRerun(step(t, nil, note(slotA, r0, r0)), rerunEvent{kind: rerunAsked})
	require.ErrorIs(t, err, errRerunInvalid, "a rerun was recorded asked without a claim")
	unsure := step(t, nil, note(slotA, r0, r0), claim, rerunEvent{kind: rerunFail, at: claim.at, err: "timeout", unsure: true, maxTries: 3})
	assert.Equal(t, RerunAsked, step(t, unsure, rerunEvent{kind: rerunAsked}).State, "an unanswered call that went through was not recorded")
	_, err = decideRerun(unsure, rerunEvent{kind: rerunClaim, actor: "s1", at: claim.at, attempt: 2, hold: time.Minute})
	require.ErrorIs(t, err, errRerunInvalid, "a round for attempt 1 claimed a call for attempt 2")
}

func TestPlanRerun(t *testing.T) {
	pending := Rerun{State: RerunPending, Since: r0}
	observed := Rerun{State: RerunPending, Since: r0, Attempt: 1}
	asking := Rerun{State: RerunAsking, Since: r0, Attempt: 1, Asker: "dead", AskUntil: r0.Add(time.Hour)}
	unsure := Rerun{State: RerunPending, Since: r0, Attempt: 1, Tries: 1, Unsure: true}
	failedRun := func(attempt int) WorkflowRun {
		return WorkflowRun{ID: 9, Attempt: attempt, Status: "completed", Conclusion: "failure"}
	}
	running := func(attempt int) WorkflowRun { return WorkflowRun{ID: 9, Attempt: attempt, Status: "in_progress"} }
	now := r0.Add(30 * time.Minute)
	for _, tt := range []struct {
		name    string
		r       Rerun
		run     WorkflowRun
		now     time.Time
		want    rerunStep
		outcome string
	}{
		{"run in progress: observe its attempt", pending, running(1), now, stepObserve, ""},
		{"run in progress, attempt known: wait", observed, running(1), now, stepWait, ""},
		{"run completed with a failure: ask", observed, failedRun(1), now, stepAsk, ""},
		{"run completed, attempt never seen: ask", pending, failedRun(1), now, stepAsk, ""},
		{"run rerun by someone else, still running", observed, running(2), now, stepSkip, OutcomeCovered},
		{"run rerun by someone else, completed", observed, failedRun(2), now, stepSkip, OutcomeCovered},
		{"run succeeded", observed, WorkflowRun{Attempt: 1, Status: "completed", Conclusion: "success"}, now, stepSkip, OutcomeNotFailed},
		{"run cancelled", observed, WorkflowRun{Attempt: 1, Status: "completed", Conclusion: "cancelled"}, now, stepSkip, OutcomeNotFailed},
		{"bound reached", Rerun{State: RerunPending, Attempt: 3, Reruns: 2}, failedRun(3), now, stepSkip, OutcomeBound},
		{"a live claim: its claimer asks", asking, failedRun(1), now, stepWait, ""},
		{"a claim ran out, the call went through", asking, running(2), r0.Add(2 * time.Hour), stepConfirm, ""},
		{"a claim ran out, no call: ask again", asking, failedRun(1), r0.Add(2 * time.Hour), stepAsk, ""},
		{"an unanswered call went through", unsure, running(2), now, stepConfirm, ""},
		{"an unanswered call did not", unsure, failedRun(1), now, stepAsk, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := planRerun(tt.r, tt.run, tt.now, 2)
			assert.Equal(t, tt.want, got.step)
			assert.Equal(t, tt.outcome, got.outcome)
		})
	}
}

func TestSplitRepo(t *testing.T) {
	for _, ok := range []string{"octo/app", "o/a.b_c-d", "Octo-Cat/.github", "a1/" + strings.Repeat("x", 100)} {
		_, _, err := SplitRepo(ok)
		require.NoError(t, err, ok)
	}
	for _, bad := range []string{"", "octo", "octo/", "/app", "octo/app/x", "octo/..", "octo/.", "-octo/app", "oc to/app", "octo/a%2fb",
		"octo/a?b", "octo/a#b", strings.Repeat("o", 40) + "/app", "octo/" + strings.Repeat("x", 101), "../octo/app"} {
		_, _, err := SplitRepo(bad)
		require.ErrorIs(t, err, ErrBadRepo, "%q", bad)
	}
}

// FuzzSplitRepo: a repository SplitRepo accepts is exactly its two parts, each a single path
// segment that escaping leaves as it is and that cannot climb out of /repos.
func FuzzSplitRepo(f *testing.F) {
	for _, s := range []string{"octo/app", "octo/..", "a/b/c", "a%2F/b", "é/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, repo string) {
		owner, name, err := SplitRepo(repo)
		if err != nil {
			require.True(t, errors.Is(err, ErrBadRepo))
			return
		}
		assert.Equal(t, repo, owner+"/"+name)
		for _, part := range []string{owner, name} {
			assert.Equal(t, part, url.PathEscape(part))
			assert.NotContains(t, part, "/")
			assert.NotEqual(t, "..", part)
			assert.NotEqual(t, ".", part)
		}
	})
}

func TestAPIBase(t *testing.T) {
	for in, want := range map[string]string{
		"https://github.com/acme":              "https://api.github.com",
		"https://www.github.com/acme/app":      "https://api.github.com",
		"https://acme.ghe.com/acme":            "https://api.acme.ghe.com",
		"https://ghes.example.com/acme":        "https://ghes.example.com/api/v3",
		"http://127.0.0.1:8080/enterprises/e/": "http://127.0.0.1:8080/api/v3",
	} {
		u, err := apiBase(in)
		require.NoError(t, err)
		assert.Equal(t, want, u.String(), in)
	}
}
