package opensandbox

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/vmworker"
)

// Start creates the sandbox of spec from the pool and returns once it is Running. The
// credential (a Gitea assignment's capability token or a GitHub slot's JIT configuration:
// vmworker.SpecCredential) stays in the controller: the sandbox gets an instance id, a
// single-use nonce for the credential and the nonce endpoint's URL, and spec.Env; spec.Files
// never leave.
//
// When the assignment's sandbox exists already (a retried dispatch, a restarted controller),
// Start returns its handle and creates nothing; one that ended is deleted and replaced. A new
// sandbox that fails or is not Running within Config.StartTimeout is deleted.
func (b *Backend) Start(ctx context.Context, spec podworker.Spec) (podworker.Handle, error) {
	cred, err := checkSpec(spec)
	if err != nil {
		return podworker.Handle{}, err
	}
	fail := func(err error) (podworker.Handle, error) {
		return podworker.Handle{}, fmt.Errorf("opensandbox: start task %d epoch %d: %w", spec.Task, spec.Epoch, err)
	}
	if sb, ok, err := b.settle(ctx, spec.Task, spec.Epoch, nil); err != nil {
		return fail(err)
	} else if ok {
		h, err := b.ready(ctx, sb)
		if err != nil {
			return fail(err)
		}
		b.envLog(h).Info().Str("state", sb.Status.State).Msg("sandbox of the assignment exists already; adopted")
		return h, nil
	}

	instance, err := vmworker.NewInstanceID()
	if err != nil {
		return fail(err)
	}
	nonce, err := vmworker.NewNonce()
	if err != nil {
		return fail(err)
	}
	if err := b.cfg.Nonces.Issue(ctx, nonce, instance, spec.Task, spec.Epoch, cred); err != nil {
		return fail(fmt.Errorf("issue nonce: %w", err))
	}
	began := time.Now()
	mine, err := b.create(ctx, spec, instance, nonce)
	if err != nil {
		return fail(err)
	}
	h, _ := b.handleOf(mine)
	b.envLog(h).Info().Str(DataPool, b.cfg.Pool).Str(DataInstanceID, instance).Msg("sandbox created")
	winner, ok, err := b.settle(ctx, spec.Task, spec.Epoch, &mine)
	if err != nil {
		return fail(errors.Join(err, b.cleanup(ctx, mine.ID)))
	}
	if !ok {
		return fail(fmt.Errorf("%w: sandbox %s is %s%s", ErrSandboxFailed, mine.ID, mine.Status.State, b.describe(mine.Status)))
	}
	h, err = b.ready(ctx, winner)
	if err != nil {
		return fail(err)
	}
	b.envLog(h).Info().Dur("took", time.Since(began)).Msg("sandbox running")
	return h, nil
}

// checkSpec validates spec and returns its credential: its capability token or its JIT
// configuration, exactly one.
func checkSpec(spec podworker.Spec) (vmworker.Credential, error) {
	if spec.Task <= 0 || spec.Epoch == 0 {
		return vmworker.Credential{}, fmt.Errorf("%w: task %d epoch %d", ErrInvalidSpec, spec.Task, spec.Epoch)
	}
	cred, err := vmworker.SpecCredential(spec)
	if err != nil {
		return vmworker.Credential{}, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	what := "capability token"
	if cred.GitHub() {
		what = "JIT configuration"
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(v, "\x00") {
			return vmworker.Credential{}, fmt.Errorf("%w: environment variable %q", ErrInvalidSpec, k)
		}
		if strings.Contains(v, cred.Secret()) {
			return vmworker.Credential{}, fmt.Errorf("%w: environment variable %s holds the %s, which never goes to a sandbox", ErrInvalidSpec, k, what)
		}
	}
	return cred, nil
}

// create creates the sandbox. The API takes no idempotency key, so when a create fails in a
// way that may have taken effect (5xx, timeout, unreadable answer) create looks the sandbox
// up by its instance id before it tries again.
func (b *Backend) create(ctx context.Context, spec podworker.Spec, instance, nonce string) (sandbox, error) {
	meta := b.metadata(spec.Task, spec.Epoch, instance, time.Now().UnixNano())
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	env[EnvInstanceID], env[EnvNonce], env[EnvEndpoint] = instance, nonce, b.cfg.Endpoint
	req := createRequest{
		Timeout:        int(b.cfg.SandboxTTL / time.Second),
		ResourceLimits: b.cfg.Resources,
		Env:            env,
		Metadata:       meta,
		Entrypoint:     b.cfg.Entrypoint,
		Extensions:     map[string]string{extensionPoolRef: b.cfg.Pool},
	}
	if b.cfg.Image != "" {
		req.Image = &imageSpec{URI: b.cfg.Image}
	}
	for attempt := 1; ; attempt++ {
		var sb sandbox
		err := b.cl.do(ctx, call{method: http.MethodPost, path: pathSandboxes, body: req, want: http.StatusAccepted, out: &sb,
			secrets: [][]byte{[]byte(nonce)}})
		if err == nil && !sandboxIDRe.MatchString(sb.ID) {
			err = fmt.Errorf("POST %s: %w: sandbox id %q", pathSandboxes, ErrMalformed, sanitize(sb.ID, b.cfg.APIKey, []byte(nonce)))
		}
		if err == nil {
			sb.Metadata = meta
			if sb.Status.State == "" {
				sb.Status.State = StatePending
			}
			return sb, nil
		}
		if ctx.Err() != nil || (!transient(err) && !errors.Is(err, ErrMalformed)) {
			return sandbox{}, fmt.Errorf("create sandbox in pool %s: %w", b.cfg.Pool, err)
		}
		// The server may have created the sandbox before the failure.
		if found, ok, lerr := b.byInstance(ctx, instance); lerr == nil && ok {
			b.log.Info().Err(err).Str(logkey.Env, found.ID).Msg("sandbox create failed, but the sandbox exists; using it")
			return found, nil
		}
		if attempt > b.cfg.Retries {
			return sandbox{}, fmt.Errorf("create sandbox in pool %s: %w", b.cfg.Pool, err)
		}
		wait := b.cl.backoff(attempt)
		b.log.Warn().Err(err).Int("attempt", attempt).Dur("retry_in", wait).Msg("sandbox create failed; retrying")
		if err := clock.Sleep(ctx, wait); err != nil {
			return sandbox{}, fmt.Errorf("create sandbox in pool %s: %w", b.cfg.Pool, err)
		}
	}
}

// byInstance finds the sandbox created with instance id.
func (b *Backend) byInstance(ctx context.Context, instance string) (sandbox, bool, error) {
	sbs, err := b.list(ctx, map[string]string{MetaInstanceID: instance})
	if err != nil {
		return sandbox{}, false, err
	}
	for _, sb := range sbs {
		if _, ok := b.handleOf(sb); ok && sb.Metadata[MetaInstanceID] == instance {
			return sb, true, nil
		}
	}
	return sandbox{}, false, nil
}

// settle looks at the sandboxes of task and epoch: it deletes those that ended and, of the
// live ones, keeps the first created and deletes the others (the losers of concurrent
// starts). mine is a sandbox just created, counted even before the list shows it. ok is
// false when no live sandbox is left.
func (b *Backend) settle(ctx context.Context, task assignment.TaskID, epoch assignment.Epoch, mine *sandbox) (sandbox, bool, error) {
	sbs, err := b.list(ctx, map[string]string{MetaTask: task.String(), MetaEpoch: epoch.String()})
	if err != nil {
		return sandbox{}, false, err
	}
	var live []sandbox
	seen := false
	for _, sb := range sbs {
		h, ok := b.handleOf(sb)
		if !ok || h.Task != task || h.Epoch != epoch {
			continue
		}
		if mine != nil && sb.ID == mine.ID {
			seen, mine.Status = true, sb.Status
		}
		switch {
		case ended(sb.Status.State):
			b.discard(ctx, h, "it ended before the assignment's start")
		case sb.Status.State == StateStopping:
			// Being deleted.
		default:
			live = append(live, sb)
		}
	}
	if mine != nil && !seen {
		live = append(live, *mine)
	}
	if len(live) == 0 {
		return sandbox{}, false, nil
	}
	slices.SortFunc(live, older)
	for _, sb := range live[1:] {
		h, _ := b.handleOf(sb)
		b.discard(ctx, h, "an earlier sandbox of the same assignment exists")
	}
	return live[0], true, nil
}

// discard deletes a sandbox Start does not use, logging a failure: the reaper retries.
func (b *Backend) discard(ctx context.Context, h podworker.Handle, why string) {
	if err := b.cleanup(ctx, h.ID); err != nil {
		b.envLog(h).Warn().Err(err).Str("why", why).Msg("could not delete a surplus sandbox; the reaper will")
		return
	}
	b.envLog(h).Info().Str("why", why).Msg("surplus sandbox deleted")
}

// cleanup deletes sandbox id even when ctx is done.
func (b *Backend) cleanup(ctx context.Context, id string) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := b.destroy(cctx, id); err != nil {
		return fmt.Errorf("clean up sandbox %s: %w", id, err)
	}
	return nil
}

// ready waits until sb is Running and returns its handle; a sandbox that does not get there
// is deleted.
func (b *Backend) ready(ctx context.Context, sb sandbox) (podworker.Handle, error) {
	h, ok := b.handleOf(sb)
	if !ok {
		return podworker.Handle{}, fmt.Errorf("%w: sandbox %s lacks dynrunner's metadata", ErrMalformed, sb.ID)
	}
	if sb.Status.State == StateRunning {
		return h, nil
	}
	if err := b.awaitRunning(ctx, sb.ID); err != nil {
		return podworker.Handle{}, errors.Join(err, b.cleanup(ctx, sb.ID))
	}
	return h, nil
}

// awaitRunning polls sandbox id until it is Running, for at most Config.StartTimeout.
func (b *Backend) awaitRunning(ctx context.Context, id string) error {
	sctx, cancel := context.WithTimeout(ctx, b.cfg.StartTimeout)
	defer cancel()
	last := sandboxStatus{State: StatePending}
	var lastErr error
	for {
		sb, err := b.get(sctx, id)
		switch {
		case err == nil:
			last, lastErr = sb.Status, nil
			if sb.Status.State == StateRunning {
				return nil
			}
			if going(sb.Status.State) {
				return fmt.Errorf("%w: sandbox %s is %s%s", ErrSandboxFailed, id, sb.Status.State, b.describe(sb.Status))
			}
		case ctx.Err() != nil:
			return fmt.Errorf("wait for sandbox %s to run: %w", id, ctx.Err())
		case errors.Is(err, podworker.ErrNotFound):
			return fmt.Errorf("%w: sandbox %s vanished while starting", ErrSandboxFailed, id)
		case sctx.Err() != nil:
			// The start timeout cut the poll short.
		case !transient(err):
			return fmt.Errorf("wait for sandbox %s to run: %w", id, err)
		default:
			lastErr = err
		}
		if sctx.Err() == nil {
			_ = clock.Sleep(sctx, b.cfg.PollInterval)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("wait for sandbox %s to run: %w", id, ctx.Err())
		}
		if sctx.Err() != nil {
			err := fmt.Errorf("%w within %v: sandbox %s is still %s%s; is pool %q out of capacity, or its image not starting?",
				ErrStartTimeout, b.cfg.StartTimeout, id, last.State, b.describe(last), b.cfg.Pool)
			if lastErr != nil {
				err = fmt.Errorf("%w; last poll: %w", err, lastErr)
			}
			return err
		}
	}
}
