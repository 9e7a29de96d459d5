package eventlog_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
)

// bus is an event log on an embedded NATS server that also listens on loopback, and an
// attacker's own client connection to it with the NATS password but not the record key.
type bus struct {
	log      *eventlog.Log
	attacker jetstream.JetStream

	mu       sync.Mutex
	rejected []eventlog.Rejection
}

func (b *bus) rejections() []eventlog.Rejection {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]eventlog.Rejection(nil), b.rejected...)
}

func newBus(t *testing.T) *bus {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	c, err := natsconn.Connect(natsconn.Config{StoreDir: t.TempDir(), Name: t.Name(), Listen: addr, User: "dynrunner", Password: "bus-password"})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	js, err := jetstream.New(c.NC)
	require.NoError(t, err)
	b := &bus{}
	cfg := eventlog.DefaultConfig()
	cfg.Key = []byte("0123456789abcdef0123456789abcdef")
	cfg.OnReject = func(r eventlog.Rejection) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.rejected = append(b.rejected, r)
	}
	b.log, err = eventlog.Open(t.Context(), js, cfg)
	require.NoError(t, err)

	nc, err := nats.Connect("nats://"+addr, nats.UserInfo("dynrunner", "bus-password"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	b.attacker, err = jetstream.New(nc)
	require.NoError(t, err)
	return b
}

// running brings task to running and returns its state.
func (b *bus) running(t *testing.T, task assignment.TaskID) assignment.State {
	t.Helper()
	ctx := t.Context()
	s, err := b.log.Apply(ctx, claim(task), nil)
	require.NoError(t, err)
	for _, ev := range []assignment.Event{
		{Transition: assignment.Dispatched},
		{Transition: assignment.Started, Handle: []byte(`{"id":"x"}`), TokenID: "tok"},
		{Transition: assignment.Registered, TokenID: "tok", RunnerUUID: "r"},
		{Transition: assignment.Running, RunnerUUID: "r"},
	} {
		ev.Task, ev.Epoch, ev.At, ev.Actor = task, s.Epoch(), t0.Add(time.Minute), "test"
		s, err = b.log.Apply(ctx, ev, &s)
		require.NoError(t, err)
	}
	return s
}

// quarantined returns the messages kept in DYNRUNNER_DEAD's quarantine subject.
func quarantined(t *testing.T, js jetstream.JetStream) []*jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(t.Context(), eventlog.StreamDead)
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	for seq := uint64(1); ; {
		m, err := s.GetMsg(t.Context(), seq, jetstream.WithGetMsgSubject(eventlog.SubjectQuarantine))
		if err != nil {
			return out
		}
		out = append(out, m)
		seq = m.Sequence + 1
	}
}

// TestForgedRecordsAreRejected: an attacker holding the NATS password but not the record key
// appends records to an assignment through its own connection. None is believed: the state
// stays the authentic one, each is reported once and moved to quarantine, and the components
// go on appending as before.
func TestForgedRecordsAreRejected(t *testing.T) {
	forgedFailed := func(st assignment.State) []byte {
		rec := st.Record
		rec.Transition, rec.Phase, rec.Reason = assignment.Failed, assignment.Failed, "attacker text in the job log"
		data, _ := json.Marshal(rec)
		return data
	}
	for _, tc := range []struct {
		name    string
		forge   func(st assignment.State) *nats.Msg
		wantErr error
	}{
		{"failed without a mac", func(st assignment.State) *nats.Msg {
			m := nats.NewMsg(eventlog.RecordSubject(st.Task, assignment.Failed))
			m.Data = forgedFailed(st)
			return m
		}, eventlog.ErrUnauthenticated},
		{"failed with a made-up mac", func(st assignment.State) *nats.Msg {
			m := nats.NewMsg(eventlog.RecordSubject(st.Task, assignment.Failed))
			m.Data = forgedFailed(st)
			m.Header.Set(eventlog.HeaderMAC, "v1."+fmt.Sprintf("%064x", 1))
			return m
		}, eventlog.ErrUnauthenticated},
		{"failed appended with the compare-and-swap header", func(st assignment.State) *nats.Msg {
			m := nats.NewMsg(eventlog.RecordSubject(st.Task, assignment.Failed))
			m.Data = forgedFailed(st)
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(st.Seq, 10))
			m.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, eventlog.Subject(st.Task))
			return m
		}, eventlog.ErrUnauthenticated},
		{"failed pretending to be the authentic record before it", func(st assignment.State) *nats.Msg {
			// nats.go reads a direct get's sequence and subject from the first header of each
			// name, which is the stored one: quarantining by it would delete the authentic
			// record.
			m := nats.NewMsg(eventlog.RecordSubject(st.Task, assignment.Failed))
			m.Data = forgedFailed(st)
			m.Header.Set(jetstream.SequenceHeader, strconv.FormatUint(st.Seq, 10))
			m.Header.Set(jetstream.SubjectHeader, eventlog.RecordSubject(st.Task, assignment.Running))
			return m
		}, eventlog.ErrUnauthenticated},
		{"malformed", func(st assignment.State) *nats.Msg {
			m := nats.NewMsg(eventlog.RecordSubject(st.Task, assignment.Renewed))
			m.Data = []byte(`{"transition": "renewed", "task_id": "not a number"`)
			return m
		}, eventlog.ErrUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBus(t)
			ctx := t.Context()
			st := b.running(t, 41)
			ack, err := b.attacker.PublishMsg(ctx, tc.forge(st))
			require.NoError(t, err, "the attacker's append reaches the stream")

			got, err := b.log.Get(ctx, 41)
			require.NoError(t, err)
			assert.Equal(t, assignment.Running, got.Phase, "Get believes the forged record")
			assert.Equal(t, st.Seq, got.Seq)
			r := b.rejections()
			require.Len(t, r, 1, "each forged message is reported once")
			assert.ErrorIs(t, r[0].Err, tc.wantErr)
			assert.Equal(t, ack.Sequence, r[0].Seq)
			assert.True(t, r[0].Quarantined, "quarantine failed: %v", r[0].QuarantineErr)
			q := quarantined(t, b.attacker)
			require.Len(t, q, 1)
			assert.Equal(t, strconv.FormatUint(ack.Sequence, 10), q[0].Header.Get(eventlog.HeaderSeq))
			assert.NotEmpty(t, q[0].Header.Get(eventlog.HeaderReason))
			asg, err := b.attacker.Stream(ctx, eventlog.StreamAssignments)
			require.NoError(t, err)
			_, err = asg.GetMsg(ctx, ack.Sequence)
			assert.ErrorIs(t, err, jetstream.ErrMsgNotFound, "the forged record is still in the assignments stream")
			_, err = asg.GetMsg(ctx, st.Seq)
			assert.NoError(t, err, "the authentic record is gone")

			// A view does not show it, nor a second one appended while the view watches, and
			// the components carry on.
			view := eventlog.NewView()
			wctx, stop := context.WithCancel(ctx)
			defer stop()
			go func() { _ = b.log.Watch(wctx, view) }()
			<-view.Ready()
			_, err = b.attacker.PublishMsg(ctx, tc.forge(st))
			require.NoError(t, err)
			require.Eventually(t, func() bool { return len(b.rejections()) == 2 }, 5*time.Second, 10*time.Millisecond)
			assert.True(t, b.rejections()[1].Quarantined)
			v, ok := view.Get(41)
			require.True(t, ok)
			assert.Equal(t, assignment.Running, v.Phase)
			next, err := b.log.Apply(ctx, assignment.Event{Transition: assignment.Renewed, Task: 41, Epoch: st.Epoch(), At: t0.Add(2 * time.Minute), Actor: "test", Lease: time.Minute}, &v)
			require.NoError(t, err)
			assert.Equal(t, assignment.Running, next.Phase)
		})
	}
}

// TestForgedClaimIsNoAssignment: a claim for a task the scheduler never claimed, and a dispatch
// for it, start nothing: the task has no assignment, and the dispatch does not parse.
func TestForgedClaimIsNoAssignment(t *testing.T) {
	b := newBus(t)
	ctx := t.Context()
	rec := assignment.Record{Transition: assignment.Claimed, Phase: assignment.Claimed, Task: 77, Backend: assignment.BackendPod,
		Actor: "attacker", At: t0, ClaimedAt: t0, PickupDeadline: t0.Add(time.Hour), LeaseExpires: t0.Add(time.Hour)}
	data, _ := json.Marshal(rec)
	_, err := b.attacker.Publish(ctx, eventlog.RecordSubject(77, assignment.Claimed), data)
	require.NoError(t, err)
	_, err = b.log.Get(ctx, 77)
	require.ErrorIs(t, err, assignment.ErrNotFound)

	// The scheduler claims the task for real afterwards: the forged claim is out of its way.
	s, err := b.log.Apply(ctx, claim(77), nil)
	require.NoError(t, err)
	assert.Equal(t, "test", s.Actor)

	// A dispatch without the MAC is refused.
	_, err = b.attacker.Publish(ctx, eventlog.SubjectDispatch+"pod", []byte(`{"task_id":77,"epoch":1}`))
	require.NoError(t, err)
	cons, err := b.log.Consumer(ctx, assignment.BackendPod)
	require.NoError(t, err)
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	require.NoError(t, err)
	_, err = b.log.ParseDispatch(msg)
	require.ErrorIs(t, err, eventlog.ErrUnauthenticated)
	require.NoError(t, b.log.Dispatch(ctx, assignment.BackendPod, 77, s.Epoch()))
	msg, err = cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	require.NoError(t, err)
	d, err := b.log.ParseDispatch(msg)
	require.NoError(t, err)
	assert.Equal(t, s.Epoch(), d.Epoch)
}

// TestReplayedRecordIsRejected: the attacker copies an authentic record, its MAC included, and
// appends it again later (to bring an ended assignment back to running) or on another task's
// subject. The first is refused by the stream's compare-and-swap, or, with the compare-and-swap
// headers stripped, by the MAC that covers them; the second by the MAC that covers the subject.
func TestReplayedRecordIsRejected(t *testing.T) {
	b := newBus(t)
	ctx := t.Context()
	st := b.running(t, 51)
	asg, err := b.attacker.Stream(ctx, eventlog.StreamAssignments)
	require.NoError(t, err)
	old, err := asg.GetMsg(ctx, st.Seq)
	require.NoError(t, err)
	done, err := b.log.Apply(ctx, assignment.Event{Transition: assignment.Completed, Task: 51, Epoch: st.Epoch(), At: t0.Add(2 * time.Minute), Actor: "test", Result: "success"}, &st)
	require.NoError(t, err)

	replay := nats.NewMsg(old.Subject)
	replay.Data, replay.Header = old.Data, old.Header
	_, err = b.attacker.PublishMsg(ctx, replay)
	require.Error(t, err, "the stream took a record whose compare-and-swap is stale")

	stripped := nats.NewMsg(old.Subject)
	stripped.Data = old.Data
	stripped.Header.Set(eventlog.HeaderMAC, old.Header.Get(eventlog.HeaderMAC))
	_, err = b.attacker.PublishMsg(ctx, stripped)
	require.NoError(t, err)

	b.running(t, 52)
	moved := nats.NewMsg(eventlog.RecordSubject(52, assignment.Running))
	moved.Data, moved.Header = old.Data, old.Header
	moved.Header.Del(jetstream.ExpectedLastSubjSeqHeader)
	moved.Header.Del(jetstream.ExpectedLastSubjSeqSubjHeader)
	_, err = b.attacker.PublishMsg(ctx, moved)
	require.NoError(t, err)

	got, err := b.log.Get(ctx, 51)
	require.NoError(t, err)
	assert.Equal(t, assignment.Completed, got.Phase)
	assert.Equal(t, done.Seq, got.Seq)
	got, err = b.log.Get(ctx, 52)
	require.NoError(t, err)
	assert.Equal(t, assignment.TaskID(52), got.Task)
	assert.Equal(t, assignment.Running, got.Phase)
	require.Len(t, b.rejections(), 2)
	for _, r := range b.rejections() {
		assert.ErrorIs(t, r.Err, eventlog.ErrUnauthenticated)
	}
}

// TestOpenRefusesAShortKey: the event log fails closed without a real key.
func TestOpenRefusesAShortKey(t *testing.T) {
	c, err := natsconn.Connect(natsconn.Config{StoreDir: t.TempDir(), Name: t.Name()})
	require.NoError(t, err)
	defer c.Close()
	js, err := jetstream.New(c.NC)
	require.NoError(t, err)
	cfg := eventlog.DefaultConfig()
	cfg.Key = []byte("short")
	_, err = eventlog.Open(t.Context(), js, cfg)
	require.ErrorIs(t, err, eventlog.ErrShortKey)
}
