package docker

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/envlock"
	"github.com/dynrunner/dynrunner/podworker"
)

// removeWait bounds how long Destroy waits for a removal another caller started.
const removeWait = 30 * time.Second

// Wait blocks until the environment's container has stopped or ctx is done, and returns the
// executor's exit code. It works the same for handles of this Backend and adopted ones (the
// engine keeps the state). It returns an error wrapping podworker.ErrNotFound when the
// container no longer exists.
func (b *Backend) Wait(ctx context.Context, h podworker.Handle) (podworker.Exit, error) {
	ref, err := b.checkHandle(h)
	if err != nil {
		return podworker.Exit{}, err
	}
	var res container.WaitResponse
	var werr error
	for pause := 100 * time.Millisecond; ; pause = min(2*pause, maxWaitRetry) {
		res, werr = b.waitOnce(ctx, ref)
		if ctx.Err() != nil {
			return podworker.Exit{}, fmt.Errorf("docker: wait %s: %w", h.ID, ctx.Err())
		}
		if !transient(werr) {
			break
		}
		// The engine restarts or is overloaded; with live-restore the container runs on, so
		// keep waiting instead of declaring the environment lost.
		b.envLog(h).Warn().Err(werr).Dur("retry_in", pause).Msg("wait on the engine failed; retrying")
		if err := clock.Sleep(ctx, pause); err != nil {
			return podworker.Exit{}, fmt.Errorf("docker: wait %s: %w", h.ID, err)
		}
	}
	c, ierr := b.inspect(ctx, ref)
	switch {
	case werr == nil && cerrdefs.IsNotFound(ierr):
		// Removed right after it stopped.
		return podworker.Exit{Code: int(res.StatusCode), Reason: "exited"}, nil
	case cerrdefs.IsNotFound(werr) || cerrdefs.IsNotFound(ierr):
		return podworker.Exit{}, fmt.Errorf("docker: wait %s: %w", h.ID, podworker.ErrNotFound)
	case werr != nil:
		return podworker.Exit{}, fmt.Errorf("docker: wait %s: %w", h.ID, werr)
	case ierr != nil:
		return podworker.Exit{}, fmt.Errorf("docker: wait %s: %w", h.ID, ierr)
	case res.Error != nil && res.Error.Message != "":
		return podworker.Exit{}, fmt.Errorf("docker: wait %s: %s", h.ID, res.Error.Message)
	}
	exit, ended := exitOf(c)
	if !ended {
		// Restarted between the wait and the inspection: not this backend's doing.
		return podworker.Exit{}, fmt.Errorf("docker: wait %s: container %s runs again", h.ID, shortID(c.ID))
	}
	return exit, nil
}

// maxWaitRetry bounds the pause between Wait's attempts while the engine is unreachable.
const maxWaitRetry = 5 * time.Second

// waitOnce blocks in the engine's wait endpoint until container ref is not running.
func (b *Backend) waitOnce(ctx context.Context, ref string) (container.WaitResponse, error) {
	api, err := b.eng.api(ctx)
	if err != nil {
		return container.WaitResponse{}, err
	}
	// The client sends exactly one of the two, and an error once ctx ends.
	w := api.ContainerWait(ctx, ref, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case res := <-w.Result:
		return res, nil
	case err := <-w.Error:
		return container.WaitResponse{}, err
	}
}

// Destroy stops the environment's container (SIGTERM, then SIGKILL after Config.Grace),
// removes it and removes its secrets directory. When ctx ends during the grace period the
// container is killed at once; the removal still completes. Destroying an environment that is
// gone, or never existed, returns nil. A container of that name that this backend's scope did
// not create is left alone, with an error wrapping ErrNotManaged.
func (b *Backend) Destroy(ctx context.Context, h podworker.Handle) error {
	ref, err := b.checkHandle(h)
	if err != nil {
		return err
	}
	unlock, err := b.lockEnv(ctx, h.ID)
	if err != nil {
		return fmt.Errorf("docker: destroy %s: %w", h.ID, err)
	}
	found, err := b.destroyLocked(ctx, h.ID, ref)
	unlock(err == nil)
	if err != nil {
		return fmt.Errorf("docker: destroy %s: %w", h.ID, err)
	}
	if found {
		b.envLog(h).Info().Msg("environment destroyed")
	}
	return nil
}

// destroyLocked removes the container ref of environment name and, unless another container
// of that name exists now, the environment's directory. It reports whether it found anything.
// The caller holds the environment's lock.
func (b *Backend) destroyLocked(ctx context.Context, name, ref string) (bool, error) {
	found := false
	c, err := b.inspect(ctx, ref)
	switch {
	case cerrdefs.IsNotFound(err):
	case err != nil:
		return false, err
	case !b.ours(c):
		return false, fmt.Errorf("container %s: %w", shortID(c.ID), ErrNotManaged)
	case strings.TrimPrefix(c.Name, "/") != name:
		return false, fmt.Errorf("container %s is named %s: %w", shortID(c.ID), c.Name, ErrInvalidHandle)
	default:
		found = true
		if err := b.removeContainer(ctx, c.ID, true); err != nil {
			return true, err
		}
	}
	if ref != name {
		// The secrets belong to whichever container has the name now: a handle of an older
		// container must not take them from a newer one.
		if _, err := b.inspect(ctx, name); err == nil {
			return found, nil
		} else if !cerrdefs.IsNotFound(err) {
			return found, err
		}
	}
	removed, err := envlock.RemoveDir(b.stateDir, name)
	return found || removed, err
}

// removeContainer stops container id (with the grace period when graceful) and removes it.
// The removal completes even when ctx ends.
func (b *Backend) removeContainer(ctx context.Context, id string, graceful bool) error {
	if graceful {
		secs := int(math.Ceil(b.grace.Seconds()))
		err := b.stop(ctx, id, secs)
		if err != nil && !cerrdefs.IsNotFound(err) && ctx.Err() == nil {
			b.log.Warn().Err(err).Str("container", shortID(id)).Msg("stop failed; removing by force")
		}
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeWait)
	defer cancel()
	err := b.remove(rctx, id)
	switch {
	case err == nil || cerrdefs.IsNotFound(err):
		return nil
	case !cerrdefs.IsConflict(err):
		return err
	}
	// Another caller is removing it: wait until it is gone.
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		if _, ierr := b.inspect(rctx, id); cerrdefs.IsNotFound(ierr) {
			return nil
		}
		if serr := clock.Sleep(rctx, pause); serr != nil {
			return fmt.Errorf("%w (waited %v for its removal)", err, removeWait)
		}
	}
}

// stop stops container id, killing it after secs seconds.
func (b *Backend) stop(ctx context.Context, id string, secs int) error {
	api, err := b.eng.api(ctx)
	if err != nil {
		return err
	}
	_, err = api.ContainerStop(ctx, id, client.ContainerStopOptions{Timeout: &secs})
	return err
}

// remove force-removes container id with its anonymous volumes.
func (b *Backend) remove(ctx context.Context, id string) error {
	api, err := b.eng.api(ctx)
	if err != nil {
		return err
	}
	_, err = api.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	return err
}

// List returns the containers of this backend's scope, running or not, and the entries of
// StateDir that have no container (see the package documentation), in name order.
func (b *Backend) List(ctx context.Context) ([]podworker.Handle, error) {
	// Directories first: an environment started in between shows up as its container.
	entries, err := os.ReadDir(b.stateDir)
	if err != nil {
		return nil, fmt.Errorf("docker: list: %w", err)
	}
	api, err := b.eng.api(ctx)
	if err != nil {
		return nil, fmt.Errorf("docker: list: %w", err)
	}
	cs, err := api.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", LabelManaged+"=true", LabelScope+"="+b.scope),
	})
	if err != nil {
		return nil, fmt.Errorf("docker: list: %w", err)
	}
	var out []podworker.Handle
	seen := make(map[string]bool)
	for _, c := range cs.Items {
		if len(c.Names) == 0 || !containerIDRe.MatchString(c.ID) {
			continue
		}
		name := strings.TrimPrefix(c.Names[0], "/")
		if !containerNameRe.MatchString(name) {
			continue
		}
		task, epoch := taskOf(c.Labels)
		if t, e, ok := b.parseEnvName(name); !ok || t != task || e != epoch {
			task, epoch = 0, 0 // not an environment this backend would have made: reap it
		}
		seen[name] = true
		out = append(out, b.handle(name, c.ID, task, epoch))
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || seen[name] || !containerNameRe.MatchString(name) {
			continue
		}
		h := podworker.Handle{Backend: backendName, ID: name}
		if task, epoch, ok := b.parseEnvName(name); ok {
			h.Task, h.Epoch = task, epoch
		}
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b podworker.Handle) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
