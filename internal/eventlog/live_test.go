package eventlog_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
)

// watchView feeds a new view from l until the test ends or stop is called, and waits until
// it is ready.
func watchView(t *testing.T, l testLog) (v *eventlog.View, stop func()) {
	t.Helper()
	v = eventlog.NewView()
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- l.Watch(ctx, v) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-errc, "Watch on cancellation")
		}
	}
	t.Cleanup(stop)
	select {
	case <-v.Ready():
	case err := <-errc:
		stopped = true
		require.FailNow(t, "Watch ended before the view was ready", "%v", err)
	case <-time.After(20 * time.Second):
		require.FailNow(t, "view not ready within 20s")
	}
	return v, stop
}

func liveTasks(v *eventlog.View) []assignment.TaskID {
	var out []assignment.TaskID
	for _, s := range v.Live() {
		out = append(out, s.Task)
	}
	slices.Sort(out)
	return out
}

func sorted(tasks []assignment.TaskID) []assignment.TaskID {
	slices.Sort(tasks)
	return tasks
}

// endAssignment fails and closes a task's assignment.
func endAssignment(t *testing.T, l testLog, task assignment.TaskID) assignment.State {
	t.Helper()
	st, err := l.Get(t.Context(), task)
	require.NoError(t, err)
	for _, tr := range []assignment.Transition{assignment.Failed, assignment.Closed} {
		st, err = l.Apply(t.Context(), assignment.Event{Transition: tr, Task: task, Epoch: st.Epoch(), Actor: "test", At: t0, Reason: "x"}, &st)
		require.NoError(t, err, tr)
	}
	return st
}

// indexed lists the tasks the live index has keys for, and its tail.
func indexed(t *testing.T, l testLog) (tasks []assignment.TaskID, tail uint64) {
	t.Helper()
	ctx := t.Context()
	lister, err := l.Live().ListKeys(ctx)
	if err == nil {
		for k := range lister.Keys() {
			if k == "tail" {
				e, err := l.Live().Get(ctx, k)
				require.NoError(t, err)
				tail, err = strconv.ParseUint(string(e.Value()), 10, 64)
				require.NoError(t, err)
				continue
			}
			id, err := assignment.ParseTaskID(k[len("task."):])
			require.NoError(t, err, k)
			tasks = append(tasks, id)
		}
	}
	slices.Sort(tasks)
	return tasks, tail
}

func lastSeq(t *testing.T, l testLog) uint64 {
	t.Helper()
	s, err := l.js.Stream(t.Context(), eventlog.StreamAssignments)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	return info.State.LastSeq
}

// TestRestartLoadsOnlyTheLiveAssignments: a controller restarts over a history of thousands of
// ended assignments and a few live ones. Its view holds exactly the live ones; an old ended
// assignment is still answered, from JetStream: a late report for it is refused.
func TestRestartLoadsOnlyTheLiveAssignments(t *testing.T) {
	dir := t.TempDir()
	l, done := openLog(t, dir)
	ctx := t.Context()
	const history = 3 * eventlog.MaxEnded
	require.NoError(t, l.GenerateEnded(ctx, 1000, history, t0))
	for task := assignment.TaskID(1); task <= 6; task++ {
		_, err := l.Apply(ctx, claim(task), nil)
		require.NoError(t, err)
	}
	endAssignment(t, l, 3)
	st, err := l.Get(ctx, 6)
	require.NoError(t, err)
	_, err = l.Apply(ctx, assignment.Event{Transition: assignment.Failed, Task: 6, Epoch: st.Epoch(), Actor: "test", At: t0, Reason: "x"}, &st)
	require.NoError(t, err)
	want := []assignment.TaskID{1, 2, 4, 5, 6} // 6 failed, not yet reported: live
	keys, _ := indexed(t, l)
	require.Equal(t, want, keys, "the index after the appends")

	// The first start reads the whole stream (the index's tail is not set), and keeps the
	// live assignments and only the last MaxEnded ended ones.
	v, stop := watchView(t, l)
	assert.Equal(t, want, liveTasks(v))
	assert.Len(t, v.Ended(), eventlog.MaxEnded, "ended assignments the view keeps")
	s3, ok := v.Get(3)
	require.True(t, ok, "the last one to end is kept")
	assert.Equal(t, assignment.Closed, s3.Phase)
	_, tail := indexed(t, l)
	assert.Equal(t, lastSeq(t, l), tail, "the start completed the index through the stream's end")
	stop()
	done()

	// The restart reads the index, not the history.
	l, done = openLog(t, dir)
	defer done()
	v, _ = watchView(t, l)
	assert.Equal(t, want, liveTasks(v))
	assert.Equal(t, len(want), v.Len(), "the view holds the live assignments and nothing else")

	// A late report for the oldest ended assignment: the view does not know it, JetStream does.
	_, ok = v.Get(1000)
	require.False(t, ok)
	old, err := l.Get(ctx, 1000)
	require.NoError(t, err)
	assert.Equal(t, assignment.Completed, old.Phase)
	_, err = l.Apply(ctx, assignment.Event{Transition: assignment.Renewed, Task: 1000, Epoch: old.Epoch(), Actor: "test", At: t0, Lease: time.Minute}, nil)
	require.ErrorIs(t, err, assignment.ErrTerminal, "a renewal of an ended assignment")
	_, err = l.Apply(ctx, assignment.Event{Transition: assignment.Renewed, Task: 1000, Epoch: old.Epoch() + 1, Actor: "test", At: t0, Lease: time.Minute}, nil)
	require.ErrorIs(t, err, assignment.ErrStaleEpoch, "a renewal with another epoch")
	keys, _ = indexed(t, l)
	assert.Equal(t, want, keys, "refused reports leave the index alone")
}

// TestStartRepairsTheIndex: a crash came between an append and the index's update: a claim
// whose key was never put, and an end whose key was never removed. The next start finds both
// in the records after the index's tail, repairs the index, and the start after that loads
// the live assignment from its key alone.
func TestStartRepairsTheIndex(t *testing.T) {
	dir := t.TempDir()
	l, done := openLog(t, dir)
	ctx := t.Context()
	_, err := l.Apply(ctx, claim(1), nil)
	require.NoError(t, err)
	_, stop := watchView(t, l) // completes the index through claim 1
	stop()
	_, tail := indexed(t, l)
	require.Equal(t, lastSeq(t, l), tail)

	// The crashes: claim 2's key lost after its append; task 1's end with its key put back (an
	// end whose purge was lost).
	c2, err := l.Apply(ctx, claim(2), nil)
	require.NoError(t, err)
	require.NoError(t, l.Live().Purge(ctx, "task.2"))
	endAssignment(t, l, 1)
	_, err = l.Live().Put(ctx, "task.1", []byte("1"))
	require.NoError(t, err)
	keys, _ := indexed(t, l)
	require.Equal(t, []assignment.TaskID{1}, keys, "the index the crashes left")
	done()

	l, done = openLog(t, dir)
	v, stop := watchView(t, l)
	assert.Equal(t, []assignment.TaskID{2}, liveTasks(v))
	keys, tail = indexed(t, l)
	assert.Equal(t, []assignment.TaskID{2}, keys, "the start repaired the index")
	assert.Equal(t, lastSeq(t, l), tail)
	e, err := l.Live().Get(ctx, "task.2")
	require.NoError(t, err)
	assert.Equal(t, strconv.FormatUint(c2.Seq, 10), string(e.Value()), "the key holds the task's last sequence")
	stop()
	done()

	// Nothing after the tail now: the next start has only the index to go by.
	l, done = openLog(t, dir)
	defer done()
	v, _ = watchView(t, l)
	assert.Equal(t, []assignment.TaskID{2}, liveTasks(v))
	assert.Equal(t, 1, v.Len())
}

// TestFollowingViewMovesTheTail: a view that follows the stream moves the index's tail past
// what it saw, so a later start reads only what came after.
func TestFollowingViewMovesTheTail(t *testing.T) {
	defer eventlog.SetLivePassEvery(0)()
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	v, _ := watchView(t, l)
	st, err := l.Apply(ctx, claim(1), nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, tail := indexed(t, l)
		return tail >= st.Seq
	}, 10*time.Second, 10*time.Millisecond, "the tail after the claim")
	_, ok := v.Get(1)
	assert.True(t, ok)
}

// TestViewKeepsTheLastEnded: the view keeps every live assignment and the last MaxEnded
// that ended, whatever the history.
func TestViewKeepsTheLastEnded(t *testing.T) {
	v := eventlog.NewView()
	const ended = 3*eventlog.MaxEnded + 7
	for task := assignment.TaskID(1); task <= 10; task++ {
		v.Observe(assignment.State{Record: assignment.Record{Task: task, Phase: assignment.Running}, Seq: uint64(task)})
	}
	for i := range ended {
		task := assignment.TaskID(100 + i)
		v.Observe(assignment.State{Record: assignment.Record{Task: task, Phase: assignment.Claimed}, Seq: uint64(1000 + 2*i)})
		v.Observe(assignment.State{Record: assignment.Record{Task: task, Phase: assignment.Completed}, Seq: uint64(1001 + 2*i)})
	}
	assert.Len(t, v.Live(), 10)
	assert.Equal(t, liveTasks(v), sorted(v.LiveTasks()), "LiveTasks")
	var yielded []assignment.TaskID
	for st := range v.LiveStates() {
		yielded = append(yielded, st.Task)
	}
	assert.Equal(t, liveTasks(v), sorted(yielded), "LiveStates")
	n := 0
	for range v.LiveStates() {
		if n++; n == 3 {
			break
		}
	}
	assert.Equal(t, 3, n, "a loop over LiveStates stops when it breaks")
	assert.Len(t, v.Ended(), eventlog.MaxEnded)
	assert.Equal(t, 10+eventlog.MaxEnded, v.Len())
	_, ok := v.Get(100 + ended - 1)
	assert.True(t, ok, "the last to end is kept")
	_, ok = v.Get(100 + ended - eventlog.MaxEnded)
	assert.True(t, ok, "the oldest kept")
	_, ok = v.Get(100 + ended - eventlog.MaxEnded - 1)
	assert.False(t, ok, "one older is gone")
}

// TestSweep: keys of assignments that ended, and their sealed tasks, are removed; what is live,
// and a sealed task whose claim is yet to come, stay.
func TestSweep(t *testing.T) {
	l, done := openLog(t, t.TempDir())
	defer done()
	ctx := t.Context()
	for task := assignment.TaskID(1); task <= 2; task++ {
		_, err := l.Apply(ctx, claim(task), nil)
		require.NoError(t, err)
		require.NoError(t, l.PutTask(ctx, task, []byte("sealed")))
	}
	endAssignment(t, l, 2)
	_, err := l.Live().Put(ctx, "task.2", []byte("1")) // put again by an append that raced the end
	require.NoError(t, err)
	require.NoError(t, l.PutTask(ctx, 3, []byte("sealed"))) // claim to come

	n, err := l.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "removed: task 2's key and sealed task")
	keys, _ := indexed(t, l)
	assert.Equal(t, []assignment.TaskID{1}, keys)
	_, err = l.GetTask(ctx, 2)
	require.ErrorIs(t, err, assignment.ErrNotFound)
	for _, task := range []assignment.TaskID{1, 3} {
		_, err = l.GetTask(ctx, task)
		require.NoError(t, err, "sealed task %d", task)
	}
}
