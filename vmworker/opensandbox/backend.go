package opensandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/podworker"
)

// listPageSize is the pageSize of list requests (the server allows up to 200).
const listPageSize = 100

// maxListPages bounds a List against a server whose pagination never ends.
const maxListPages = 1000

// cleanupTimeout bounds the deletion of a sandbox a failed Start leaves.
const cleanupTimeout = 30 * time.Second

// Backend runs one OpenSandbox sandbox (a Kata microVM from the pool) per job.
type Backend struct {
	cfg Config
	cl  *client
	log zerolog.Logger
}

var _ podworker.Backend = (*Backend)(nil)

// New returns a Backend for cfg. It sends no request; the first Start or List does.
func New(cfg Config) (*Backend, error) {
	cfg, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	log := cfg.Log.With().Str(logkey.Backend, backendName).Logger()
	return &Backend{
		cfg: cfg,
		cl: &client{
			base: cfg.BaseURL, key: cfg.APIKey, hc: cfg.HTTPClient, timeout: cfg.Timeout, retries: cfg.Retries,
			backoffBase: cfg.RetryBase, backoffMax: cfg.RetryMax, maxRetryWait: cfg.MaxRetryWait, log: log,
		},
		log: log,
	}, nil
}

// Name implements podworker.Backend.
func (b *Backend) Name() string { return backendName }

// Wait polls the sandbox's state until it is Terminated or Failed, and returns an Exit with
// code -1 (the API reports no exit code) and the server's reason. A sandbox that is gone is
// podworker.ErrNotFound. Timeouts, 429 and 5xx answers only delay the next poll; a refused
// key or a malformed answer ends Wait with the error.
func (b *Backend) Wait(ctx context.Context, h podworker.Handle) (podworker.Exit, error) {
	id, err := checkHandle(h)
	if err != nil {
		return podworker.Exit{}, err
	}
	failing := false
	for {
		sb, err := b.get(ctx, id)
		switch {
		case err == nil:
			if failing {
				b.envLog(h).Info().Msg("OpenSandbox answers again")
				failing = false
			}
			if ended(sb.Status.State) {
				return podworker.Exit{Code: -1, Reason: "sandbox " + strings.ToLower(sb.Status.State) + b.describe(sb.Status)}, nil
			}
		case ctx.Err() != nil:
			return podworker.Exit{}, fmt.Errorf("opensandbox: wait for sandbox %s: %w", id, ctx.Err())
		case errors.Is(err, podworker.ErrNotFound):
			return podworker.Exit{}, fmt.Errorf("opensandbox: wait for sandbox %s: %w", id, podworker.ErrNotFound)
		case transient(err):
			if !failing {
				b.envLog(h).Warn().Err(err).Msg("OpenSandbox unavailable while waiting; polling on")
				failing = true
			}
		default:
			return podworker.Exit{}, fmt.Errorf("opensandbox: wait for sandbox %s: %w", id, err)
		}
		if err := clock.Sleep(ctx, b.cfg.PollInterval); err != nil {
			return podworker.Exit{}, fmt.Errorf("opensandbox: wait for sandbox %s: %w", id, err)
		}
	}
}

// Destroy deletes the sandbox. A sandbox that is gone, or already stopping, counts as
// destroyed.
func (b *Backend) Destroy(ctx context.Context, h podworker.Handle) error {
	id, err := checkHandle(h)
	if err != nil {
		return err
	}
	if err := b.destroy(ctx, id); err != nil {
		return fmt.Errorf("opensandbox: destroy sandbox %s: %w", id, err)
	}
	b.envLog(h).Info().Msg("sandbox deleted")
	return nil
}

// destroy deletes sandbox id; gone or stopping is success.
func (b *Backend) destroy(ctx context.Context, id string) error {
	err := b.cl.do(ctx, call{method: http.MethodDelete, path: sandboxPath(id), want: http.StatusNoContent, idempotent: true})
	switch {
	case err == nil || errors.Is(err, podworker.ErrNotFound):
		return nil
	case errors.Is(err, ErrConflict):
		// The state forbids a delete now: fine if that is because the sandbox is already
		// going away.
		sb, gerr := b.get(ctx, id)
		if errors.Is(gerr, podworker.ErrNotFound) || (gerr == nil && (sb.Status.State == StateStopping || sb.Status.State == StateTerminated)) {
			return nil
		}
	}
	return err
}

// List returns every sandbox of the backend's scope, whatever its state.
func (b *Backend) List(ctx context.Context) ([]podworker.Handle, error) {
	sbs, err := b.list(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("opensandbox: list sandboxes: %w", err)
	}
	var out []podworker.Handle
	for _, sb := range sbs {
		if h, ok := b.handleOf(sb); ok {
			out = append(out, h)
		}
	}
	return out, nil
}

// get fetches sandbox id.
func (b *Backend) get(ctx context.Context, id string) (sandbox, error) {
	var sb sandbox
	err := b.cl.do(ctx, call{method: http.MethodGet, path: sandboxPath(id), want: http.StatusOK, out: &sb, idempotent: true})
	if err != nil {
		return sandbox{}, err
	}
	if sb.ID != id || sb.Status.State == "" {
		return sandbox{}, fmt.Errorf("GET %s: %w: want the sandbox with its id and status.state, got id %q state %q",
			sandboxPath(id), ErrMalformed, sanitize(sb.ID, b.cfg.APIKey), sanitize(sb.Status.State, b.cfg.APIKey))
	}
	return sb, nil
}

// list returns the sandboxes of the scope whose metadata also has the extra pairs, all pages.
func (b *Backend) list(ctx context.Context, extra map[string]string) ([]sandbox, error) {
	var all []sandbox
	for page := 1; page <= maxListPages; page++ {
		q := b.scopeQuery(extra)
		q.Set("page", strconv.Itoa(page))
		q.Set("pageSize", strconv.Itoa(listPageSize))
		var lr listResponse
		if err := b.cl.do(ctx, call{method: http.MethodGet, path: pathSandboxes, query: q, want: http.StatusOK, out: &lr, idempotent: true}); err != nil {
			return nil, err
		}
		if lr.Pagination == nil {
			return nil, fmt.Errorf("GET %s: %w: the answer has no pagination", pathSandboxes, ErrMalformed)
		}
		all = append(all, lr.Items...)
		if !lr.Pagination.HasNextPage || len(lr.Items) == 0 {
			return all, nil
		}
	}
	return nil, fmt.Errorf("GET %s: %w: more than %d pages", pathSandboxes, ErrMalformed, maxListPages)
}

// transient reports whether err may pass by itself.
func transient(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRateLimited)
}

// describe renders a status's reason and message for an error or an Exit.
func (b *Backend) describe(st sandboxStatus) string {
	detail := strings.TrimPrefix(strings.TrimSpace(st.Reason+": "+st.Message), ":")
	detail = strings.TrimSuffix(strings.TrimSpace(detail), ":")
	if detail == "" {
		return ""
	}
	return " (" + sanitize(detail, b.cfg.APIKey) + ")"
}

func (b *Backend) envLog(h podworker.Handle) *zerolog.Logger {
	l := b.log.With().Int64(logkey.TaskID, int64(h.Task)).Uint64(logkey.Epoch, uint64(h.Epoch)).Str(logkey.Env, h.ID).Logger()
	return &l
}
