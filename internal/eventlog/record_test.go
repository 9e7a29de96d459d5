package eventlog

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// FuzzDecodeRecord: a record the log signed decodes to exactly what was written; a change to
// any byte of its subject, body or compare-and-swap headers, or a record signed with another
// key, is refused as unauthenticated. Random messages are never believed.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(uint64(7), "started", uint64(3), 0, byte(1), []byte(nil))
	f.Add(uint64(1), "claimed", uint64(0), 40, byte(0x20), []byte(`{"transition":"claimed"}`))
	f.Add(uint64(99), "renewed", uint64(12), 1000, byte(0xff), []byte("v1.00"))
	f.Fuzz(func(t *testing.T, task uint64, tr string, prev uint64, at int, flip byte, junk []byte) {
		if task == 0 || task > 1<<62 {
			return
		}
		l := &Log{sign: signer{key: []byte("0123456789abcdef0123456789abcdef")}}
		id := assignment.TaskID(task)
		rec := assignment.Record{Transition: assignment.Transition(tr), Phase: assignment.Started, Task: id, Epoch: 5,
			Actor: "fuzz", At: time.Unix(1700000000, 0).UTC()}
		subject := RecordSubject(id, rec.Transition)
		data, err := json.Marshal(rec)
		require.NoError(t, err)
		msg := nats.NewMsg(subject)
		msg.Data = data
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(prev, 10))
		msg.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, Subject(id))
		l.sign.sign(msg)

		st, err := l.decodeRecord(msg.Subject, msg.Header, msg.Data, 42)
		if _, _, perr := parseRecordSubject(subject); perr == nil && !strings.Contains(tr, ".") && utf8.ValidString(tr) {
			require.NoError(t, err)
			assert.Equal(t, rec, st.Record)
			assert.Equal(t, uint64(42), st.Seq)
		}

		// One byte changed anywhere the MAC covers.
		if flip == 0 {
			flip = 1
		}
		parts := [][]byte{[]byte(msg.Subject), msg.Data, []byte(msg.Header.Get(jetstream.ExpectedLastSubjSeqHeader))}
		part := parts[uint(at)%uint(len(parts))]
		if len(part) > 0 {
			mut := append([]byte(nil), part...)
			mut[uint(at)%uint(len(mut))] ^= flip
			subj, data, hdr := msg.Subject, msg.Data, cloneHeader(msg.Header)
			switch uint(at) % uint(len(parts)) {
			case 0:
				subj = string(mut)
			case 1:
				data = mut
			case 2:
				hdr.Set(jetstream.ExpectedLastSubjSeqHeader, string(mut))
			}
			_, err := l.decodeRecord(subj, hdr, data, 42)
			require.ErrorIs(t, err, ErrUnauthenticated)
		}

		// Another key's record, and junk with a made-up MAC.
		other := &Log{sign: signer{key: []byte("fedcba9876543210fedcba9876543210")}}
		_, err = other.decodeRecord(msg.Subject, msg.Header, msg.Data, 42)
		require.ErrorIs(t, err, ErrUnauthenticated)
		h := nats.Header{}
		h.Set(HeaderMAC, string(junk))
		_, err = l.decodeRecord(subject, h, junk, 42)
		require.ErrorIs(t, err, ErrRejected)
	})
}

func cloneHeader(h nats.Header) nats.Header {
	out := nats.Header{}
	for k, v := range h {
		out[k] = append([]string(nil), v...)
	}
	return out
}
