package facade

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/workload"
)

// ServerLimits bound what one caller can make the facade hold: every message, every request's
// time, and how many requests one identity has in flight. The zero value means the defaults.
type ServerLimits struct {
	// MaxMessageBytes bounds each message after decompression (connect's read limit) and each
	// request body (DefaultMaxMessageBytes).
	MaxMessageBytes int
	// ReadTimeout bounds reading a whole request, body included (a caller trickling its body
	// is cut off); WriteTimeout the answer, which may wait for the forge; IdleTimeout a
	// kept-alive connection between requests.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// PerIdentity is how many requests one environment (one SPIFFE ID; a guest: one address)
	// may have in flight; more are refused at once.
	PerIdentity int
	// HandshakeLogEvery is the least time between two log lines about refused TLS handshakes,
	// and between two about refused requests of one reason; the refusals in between are
	// counted into the next line (and all of them into dynrunner_facade_refused_total).
	HandshakeLogEvery time.Duration
}

// The default limits. A request of the runner API is a log batch or a state report; 8 MiB holds
// the log a runner has pending after its facade was unreachable for a minute at 100 KiB/s. At
// most DefaultPerIdentity such requests of one environment are read at once, each costing the
// facade a few times its size while it is decoded.
const (
	DefaultMaxMessageBytes = 8 << 20
	DefaultPerIdentity     = 4
)

func (l ServerLimits) withDefaults() ServerLimits {
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = time.Minute
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = 2 * time.Minute
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = 2 * time.Minute
	}
	if l.PerIdentity <= 0 {
		l.PerIdentity = DefaultPerIdentity
	}
	if l.HandshakeLogEvery <= 0 {
		l.HandshakeLogEvery = 10 * time.Second
	}
	return l
}

// Server returns the HTTP server for one of the facade's listeners: h (Handler or
// GuestHandler) behind tlsConfig, with the facade's limits. Serve it with ServeTLS(ln, "", "").
func (f *Facade) Server(h http.Handler, tlsConfig *tls.Config) *http.Server {
	l := f.limits
	return &http.Server{
		Handler:           f.bounded(h),
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          log.New(&handshakeLog{log: f.cfg.Log, metrics: f.cfg.Metrics, limit: f.logLimit}, "", 0),
	}
}

// bounded caps each request's body and the requests each identity has in flight.
func (f *Facade) bounded(h http.Handler) http.Handler {
	var mu sync.Mutex
	inFlight := map[string]int{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := requester(r)
		mu.Lock()
		if inFlight[who] >= f.limits.PerIdentity {
			mu.Unlock()
			f.cfg.Metrics.Refused.WithLabelValues("too_many_requests").Inc()
			if ok, suppressed := f.logLimit.allow("too_many_requests"); ok {
				f.cfg.Log.Warn().Str("caller", who).Int("in_flight", f.limits.PerIdentity).Int("suppressed", suppressed).
					Msg("facade refused a request: too many in flight from one caller")
			}
			http.Error(w, fmt.Sprintf("dynrunner facade: %d requests of yours are in flight already", f.limits.PerIdentity), http.StatusTooManyRequests)
			return
		}
		inFlight[who]++
		mu.Unlock()
		defer func() {
			mu.Lock()
			if inFlight[who]--; inFlight[who] == 0 {
				delete(inFlight, who)
			}
			mu.Unlock()
		}()
		// Compressed bodies are smaller than what they inflate to, which connect bounds.
		r.Body = http.MaxBytesReader(w, r.Body, int64(f.limits.MaxMessageBytes)+64<<10)
		h.ServeHTTP(w, r)
	})
}

// requester names the caller for the in-flight cap: its SPIFFE ID, or without a client
// certificate (a microVM guest) its address.
func requester(r *http.Request) string {
	if id, err := workload.PeerID(r); err == nil {
		return id.String()
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return "guest at " + host
}

// logLimit lets one log line of each kind through per interval and counts the ones it held
// back, so no caller can flood the controller's log with refusals (the metrics count all).
type logLimit struct {
	every time.Duration

	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

// allow reports whether a line of kind may be logged now, and how many were held back since
// the last one. Kinds are a fixed set (refusal reasons), never caller input.
func (l *logLimit) allow(kind string) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.suppressed = map[string]time.Time{}, map[string]int{}
	}
	now := time.Now()
	if last, ok := l.last[kind]; ok && now.Sub(last) < l.every {
		l.suppressed[kind]++
		return false, 0
	}
	n := l.suppressed[kind]
	l.last[kind], l.suppressed[kind] = now, 0
	return true, n
}

// handshakeLog turns the HTTP server's error lines into structured ones: refused TLS
// handshakes (a wrong or missing SVID, a scanner) as one warning per HandshakeLogEvery with a
// count of those suppressed since; anything else as it comes.
type handshakeLog struct {
	log     zerolog.Logger
	metrics *Metrics
	limit   *logLimit
}

func (h *handshakeLog) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	rest, ok := strings.CutPrefix(line, "http: TLS handshake error from ")
	if !ok {
		h.log.Warn().Str("error", line).Msg("facade listener")
		return len(p), nil
	}
	h.metrics.Refused.WithLabelValues("handshake").Inc()
	remote, reason, _ := strings.Cut(rest, ": ")
	ok, suppressed := h.limit.allow("handshake")
	if !ok {
		return len(p), nil
	}
	h.log.Warn().Str("remote", remote).Str("reason", reason).Int("suppressed", suppressed).
		Msg("facade refused a TLS handshake")
	return len(p), nil
}
