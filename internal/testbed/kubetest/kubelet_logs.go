package kubetest

import (
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// handler serves the part of the kubelet's API the apiserver uses for pods/log:
// GET /containerLogs/{namespace}/{pod}/{container} with tailLines, limitBytes, follow,
// timestamps and sinceSeconds. The TLS layer has checked the apiserver's client certificate.
func (k *Kubelet) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", k.containerLogs)
	return mux
}

func (k *Kubelet) containerLogs(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	ids, err := k.containers(ctx, map[string]string{
		labelKubelet:      k.id,
		labelPodNamespace: r.PathValue("namespace"),
		labelPodName:      r.PathValue("pod"),
		labelContainer:    r.PathValue("container"),
	})
	switch {
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	case len(ids) == 0:
		http.Error(w, "container not found", http.StatusNotFound)
		return
	}
	in := r.URL.Query()
	q := url.Values{"stdout": {"1"}, "stderr": {"1"}, "tail": {"all"}}
	if n := in.Get("tailLines"); n != "" {
		q.Set("tail", n)
	}
	if in.Get("follow") == "true" {
		q.Set("follow", "1")
	}
	if in.Get("timestamps") == "true" {
		q.Set("timestamps", "1")
	}
	if s, err := strconv.Atoi(in.Get("sinceSeconds")); err == nil && s > 0 {
		q.Set("since", strconv.FormatInt(time.Now().Add(-time.Duration(s)*time.Second).Unix(), 10))
	}
	resp, err := k.eng.do(ctx, http.MethodGet, "/containers/"+ids[0]+"/logs", q, nil, "")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer resp.Body.Close()
	var out io.Writer = w
	if n, err := strconv.ParseInt(in.Get("limitBytes"), 10, 64); err == nil && n > 0 {
		out = &limitWriter{w: w, left: n}
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusOK)
	_ = copyFrames(out, resp.Body, w)
}

// copyFrames copies the payloads of the engine's multiplexed log stream (frames of an 8-byte
// header, stream and big-endian length, and data) to w, stdout and stderr interleaved as they
// came, flushing after each frame so a follow streams.
func copyFrames(w io.Writer, r io.Reader, flush any) error {
	f, _ := flush.(http.Flusher)
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil
			}
			return err
		}
		if _, err := io.CopyN(w, r, int64(binary.BigEndian.Uint32(hdr[4:]))); err != nil {
			return err
		}
		if f != nil {
			f.Flush()
		}
	}
}

// limitWriter writes at most left bytes, then fails.
type limitWriter struct {
	w    io.Writer
	left int64
}

var errLimit = errors.New("limitBytes reached")

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, errLimit
	}
	short := int64(len(p)) > l.left
	if short {
		p = p[:l.left]
	}
	n, err := l.w.Write(p)
	l.left -= int64(n)
	if err == nil && short {
		err = errLimit
	}
	return n, err
}
