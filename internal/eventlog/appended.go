package eventlog

import (
	"bytes"
	"sync"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// maxAppended bounds how many of its own appends a Log remembers for its views: a view reads
// a record back within milliseconds of its append, so a few thousand cover every append in
// flight.
const maxAppended = 4096

// appended remembers the records this Log appended, by stream sequence, so a view following
// the stream need not verify and decode them again: the message at a sequence the server
// acknowledged to this Log's append is that append, and it is only taken as such when its
// subject and bytes are the ones sent. Anything else is verified and decoded as usual.
type appended struct {
	mu   sync.Mutex
	recs map[uint64]appendedRec
	ring []uint64 // the sequences in recs, oldest first from next
	next int
}

type appendedRec struct {
	subject string
	data    []byte
	st      assignment.State
}

// add remembers st, appended as data on subject, forgetting the oldest beyond maxAppended.
func (a *appended) add(subject string, data []byte, st assignment.State) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.recs == nil {
		a.recs = make(map[uint64]appendedRec, maxAppended)
		a.ring = make([]uint64, 0, maxAppended)
	}
	if len(a.ring) < maxAppended {
		a.ring = append(a.ring, st.Seq)
	} else {
		delete(a.recs, a.ring[a.next])
		a.ring[a.next] = st.Seq
		a.next = (a.next + 1) % maxAppended
	}
	a.recs[st.Seq] = appendedRec{subject: subject, data: data, st: st}
}

// get returns the state this Log appended at seq, when the message read there has the subject
// and bytes it sent, and forgets it: a view takes each record once, and a second view of the
// same Log verifies and decodes it as usual.
func (a *appended) get(seq uint64, subject string, data []byte) (assignment.State, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.recs[seq]
	if !ok || r.subject != subject || !bytes.Equal(r.data, data) {
		return assignment.State{}, false
	}
	delete(a.recs, seq)
	return r.st, true
}
