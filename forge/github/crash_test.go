package github_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github"
	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
)

var errKilled = errors.New("the holder was killed")

// dyingLog is a holder's event log that dies at its at-th write (a claim or transition, a
// stored configuration, a dispatch): that write and every one after it fail, as for a
// controller killed (SIGKILL) just before it.
type dyingLog struct {
	*eventlog.Log
	at int

	mu     sync.Mutex
	writes int
	what   string
}

func (d *dyingLog) write(what string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writes++
	if d.writes >= d.at {
		if d.writes == d.at {
			d.what = what
		}
		return errKilled
	}
	return nil
}

func (d *dyingLog) dead() (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.what, d.writes >= d.at
}

func (d *dyingLog) Apply(ctx context.Context, ev assignment.Event, hint *assignment.State) (assignment.State, error) {
	if err := d.write(string(ev.Transition)); err != nil {
		return assignment.State{}, err
	}
	return d.Log.Apply(ctx, ev, hint)
}

func (d *dyingLog) PutTask(ctx context.Context, task assignment.TaskID, sealed []byte) error {
	if err := d.write("store the JIT configuration"); err != nil {
		return err
	}
	return d.Log.PutTask(ctx, task, sealed)
}

func (d *dyingLog) DropTask(ctx context.Context, task assignment.TaskID) error {
	if err := d.write("drop a JIT configuration"); err != nil {
		return err
	}
	return d.Log.DropTask(ctx, task)
}

func (d *dyingLog) Dispatch(ctx context.Context, backend assignment.Backend, task assignment.TaskID, epoch assignment.Epoch) error {
	if err := d.write("dispatch"); err != nil {
		return err
	}
	return d.Log.Dispatch(ctx, backend, task, epoch)
}

// TestSlotsSurviveTheirHolderDyingAtEveryStep: a job's slot goes claim → JIT configuration
// stored → configured → dispatched → JobStarted → JobCompleted. The holder of the session dies
// before each of those writes in turn; the next holder (another replica, its own Slots and
// session, the same JetStream and GitHub) finishes: the job completes on exactly one slot, no
// slot is configured or dispatched twice, and no runner is left at GitHub.
func TestSlotsSurviveTheirHolderDyingAtEveryStep(t *testing.T) {
	for at := 1; at <= 20; at++ {
		died := false
		if !t.Run(fmt.Sprintf("write %d", at), func(t *testing.T) { died = dieAt(t, at) }) {
			return
		}
		if !died {
			require.GreaterOrEqual(t, at, 7, "the lifecycle made fewer writes than its six steps")
			return
		}
	}
	require.Fail(t, "the lifecycle made more than 19 writes")
}

// dieAt runs one job with a holder that dies at its at-th write and reports whether it did.
func dieAt(t *testing.T, at int) (died bool) {
	b := newSlotBed(t, 4)
	slots := func(events github.SlotLog) *github.Slots {
		return github.NewSlots(github.SlotsConfig{Events: events, View: b.view, Box: slotBox, Actor: "scheduler@test",
			Capacity: func(assignment.Backend) int { return 4 }, Pickup: 10 * time.Minute, Log: zerolog.Nop()})
	}
	dying := &dyingLog{Log: b.log, at: at}
	stop := run(t, b.session(b.pod, "scheduler@first", slots(dying)))
	// took over says whether the next holder runs: once the first died, it is stopped (its
	// session closed, its lease released: the session of a holder killed outright times out
	// on GitHub, TestSessionOfADeadHolderTimesOut) and the next one starts.
	tookOver := false
	takeOver := func() bool {
		what, dead := dying.dead()
		if dead && !tookOver {
			t.Logf("the first holder died at write %d (%s)", at, what)
			stop()
			run(t, b.session(b.pod, "scheduler@next", slots(b.log)))
			tookOver = true
		}
		return dead
	}
	var dispatched []assignment.TaskID
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		require.Eventually(t, func() bool {
			takeOver()
			dispatched = append(dispatched, b.dispatched(t)...)
			return cond()
		}, 30*time.Second, 20*time.Millisecond, what)
	}

	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}, Run: "true"})
	require.NoError(t, err)
	var slot assignment.State
	waitFor("no slot was configured", func() bool {
		for _, st := range b.live() {
			if st.Ready() {
				slot = st
				return true
			}
		}
		return false
	})
	_, err = b.srv.StartJob(job, int(slot.RunnerID))
	require.NoError(t, err)
	waitFor("JobStarted was not recorded", func() bool { return b.state(t, slot.Task).Phase == assignment.Running })
	require.NoError(t, b.srv.CompleteJob(job, "succeeded"))
	waitFor("JobCompleted was not recorded", func() bool { return b.state(t, slot.Task).Phase == assignment.Completed })
	assert.Equal(t, "succeeded", b.state(t, slot.Task).Result)
	waitFor("slots or runners were left", func() bool { return len(b.live()) == 0 && len(b.srv.Runners()) == 0 })

	counts := map[assignment.TaskID]int{}
	for _, task := range dispatched {
		counts[task]++
	}
	for task, n := range counts {
		assert.Equal(t, 1, n, "slot %d was dispatched %d times", task, n)
	}
	if _, dead := dying.dead(); dead {
		return true
	}
	assert.Equal(t, 1, counts[slot.Task], "the slot was not dispatched")
	return false
}

// staleView is a view behind the log: it shows the states it was given.
type staleView []assignment.State

func (v staleView) Live() []assignment.State { return v }

// TestSlotsActOnTheLogNotAViewBehindIt: a holder whose view still shows a slot as claimed and
// unconfigured, or idle, after the slot went on in the log neither configures nor dispatches
// it again, nor retires it once its runner took a job.
func TestSlotsActOnTheLogNotAViewBehindIt(t *testing.T) {
	b := newSlotBed(t, 4)
	ctx := t.Context()
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "pod"}})
	require.NoError(t, err)
	run(t, b.sess)
	var seen assignment.State // the slot as claimed, before its runner was configured
	require.Eventually(t, func() bool {
		live := b.live()
		if len(live) != 1 || !live[0].Ready() {
			return false
		}
		seen = live[0]
		return true
	}, 15*time.Second, 20*time.Millisecond)
	require.Len(t, b.dispatched(t), 1)
	_, err = b.srv.StartJob(job, int(seen.RunnerID))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.state(t, seen.Task).Phase == assignment.Running }, 10*time.Second, 20*time.Millisecond)

	seen.RunnerID, seen.TaskDigest, seen.Phase = 0, "", assignment.Claimed
	behind := github.NewSlots(github.SlotsConfig{Events: b.log, View: staleView{seen}, Box: slotBox, Actor: "scheduler@behind",
		Capacity: func(assignment.Backend) int { return 4 }, Pickup: 10 * time.Minute, Log: zerolog.Nop()})
	runners := len(b.srv.Runners())
	require.NoError(t, behind.Reconcile(ctx, b.sess))
	assert.Empty(t, b.dispatched(t), "a slot was dispatched again")
	assert.Len(t, b.srv.Runners(), runners, "a runner was made again")
	assert.Equal(t, assignment.Running, b.state(t, seen.Task).Phase)
}
