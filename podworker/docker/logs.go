package docker

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/dynrunner/dynrunner/podworker"
)

var _ podworker.Diagnoser = (*Backend)(nil)

// Bounds on what Diagnose reads: the last diagnoseTail lines of stderr, at most maxLogRead
// bytes of the engine's answer.
const (
	diagnoseTail = 200
	maxLogRead   = 1 << 20
)

// Diagnose returns the executor's own final error line, if it wrote one. It reads only the
// container's stderr, where the executor logs; the job's output goes to stdout and is never
// returned.
func (b *Backend) Diagnose(ctx context.Context, h podworker.Handle) (string, error) {
	ref, err := b.checkHandle(h)
	if err != nil {
		return "", err
	}
	q := url.Values{"stdout": {"0"}, "stderr": {"1"}, "tail": {fmt.Sprint(diagnoseTail)}}
	resp, err := b.eng.do(ctx, http.MethodGet, "/containers/"+url.PathEscape(ref)+"/logs", q, nil)
	if isNotFound(err) {
		return "", fmt.Errorf("docker: diagnose %s: %w", h.ID, podworker.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("docker: diagnose %s: %w", h.ID, err)
	}
	defer resp.Body.Close()
	// The backend never gives a container a TTY, so the engine multiplexes its streams.
	var last string
	sc := bufio.NewScanner(demux(io.LimitReader(resp.Body, maxLogRead), 2))
	sc.Buffer(make([]byte, 64<<10), maxLogRead)
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); strings.HasPrefix(s, podworker.ExecutorErrorPrefix) {
			last = s
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, bufio.ErrTooLong) {
		return last, fmt.Errorf("docker: diagnose %s: %w", h.ID, err)
	}
	return last, nil
}

// demux returns the payload of stream (1 stdout, 2 stderr) from the engine's multiplexed log
// format: frames of an 8-byte header (stream, three zero bytes, big-endian length) and data.
func demux(r io.Reader, stream byte) io.Reader { return &demuxReader{r: r, stream: stream} }

type demuxReader struct {
	r      io.Reader
	stream byte
	left   int64 // bytes left in the current frame
	keep   bool  // whether the current frame is of stream
}

func (d *demuxReader) Read(p []byte) (int, error) {
	for {
		if d.left == 0 {
			var hdr [8]byte
			if _, err := io.ReadFull(d.r, hdr[:]); err != nil {
				if errors.Is(err, io.ErrUnexpectedEOF) {
					err = io.EOF
				}
				return 0, err
			}
			d.left = int64(binary.BigEndian.Uint32(hdr[4:]))
			d.keep = hdr[0] == d.stream
			continue
		}
		if !d.keep {
			n, err := io.CopyN(io.Discard, d.r, d.left)
			d.left -= n
			if err != nil {
				return 0, err
			}
			continue
		}
		if int64(len(p)) > d.left {
			p = p[:d.left]
		}
		n, err := d.r.Read(p)
		d.left -= int64(n)
		if errors.Is(err, io.EOF) && d.left > 0 && n == 0 {
			return 0, io.EOF
		}
		if n > 0 {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}
