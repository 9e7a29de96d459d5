package docker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/envlock"
	"github.com/dynrunner/dynrunner/podworker"
)

// cleanupTimeout bounds the removal of a half-created environment after a failed Start.
const cleanupTimeout = 30 * time.Second

// Start creates and starts the container of spec. When the environment's container already
// runs (a retried dispatch), Start returns its handle and creates nothing. When it exists but
// has stopped, Start removes it and its secrets and starts afresh.
func (b *Backend) Start(ctx context.Context, spec podworker.Spec) (podworker.Handle, error) {
	if err := validateSpec(spec); err != nil {
		return podworker.Handle{}, err
	}
	name := b.envName(spec.Task, spec.Epoch)
	unlock, err := b.lockEnv(ctx, name)
	if err != nil {
		return podworker.Handle{}, fmt.Errorf("docker: start %s: %w", name, err)
	}
	defer unlock(false)
	c, err := b.inspect(ctx, name)
	switch {
	case err == nil:
		if !b.ours(c) {
			return podworker.Handle{}, fmt.Errorf("docker: start %s: container %s: %w", name, shortID(c.ID), ErrNotManaged)
		}
		if c.State.Running {
			h := b.handle(name, c.ID, spec.Task, spec.Epoch)
			b.envLog(h).Info().Msg("environment already running")
			return h, nil
		}
		// Left over from an earlier attempt: remove it with its secrets.
		if _, err := b.destroyLocked(ctx, name, c.ID); err != nil {
			return podworker.Handle{}, fmt.Errorf("docker: start %s: wipe: %w", name, err)
		}
	case cerrdefs.IsNotFound(err):
		if _, err := envlock.RemoveDir(b.stateDir, name); err != nil {
			return podworker.Handle{}, fmt.Errorf("docker: start %s: wipe: %w", name, err)
		}
	default:
		return podworker.Handle{}, fmt.Errorf("docker: start %s: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return podworker.Handle{}, fmt.Errorf("docker: start %s: %w", name, err)
	}
	began := time.Now()
	h, err := b.create(ctx, name, spec)
	if err != nil {
		return podworker.Handle{}, fmt.Errorf("docker: start %s: %w", name, err)
	}
	b.envLog(h).Info().Dur("took", time.Since(began)).Msg("environment started")
	return h, nil
}

// create writes the secrets, creates and starts the container. On error it leaves nothing
// behind.
func (b *Backend) create(ctx context.Context, name string, spec podworker.Spec) (h podworker.Handle, err error) {
	var id string
	defer func() {
		if err == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if id != "" {
			if rerr := b.removeContainer(cctx, id, false); rerr != nil {
				err = errors.Join(err, fmt.Errorf("clean up: %w", rerr))
			}
		}
		if _, rerr := envlock.RemoveDir(b.stateDir, name); rerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", rerr))
		}
	}()
	secrets, err := b.writeSecrets(name, spec.Files)
	if err != nil {
		return h, err
	}
	api, err := b.eng.api(ctx)
	if err != nil {
		return h, err
	}
	cfg, hc := b.containerConfig(spec, secrets)
	created, err := api.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name, Config: cfg, HostConfig: hc})
	if err != nil {
		return h, err
	}
	id = created.ID
	if !containerIDRe.MatchString(id) {
		return h, fmt.Errorf("create answered container id %q", id)
	}
	for _, w := range created.Warnings {
		b.log.Warn().Str("env", name).Str("warning", w).Msg("engine warning on create")
	}
	if _, err := api.ContainerStart(ctx, id, client.ContainerStartOptions{}); err != nil {
		return h, err
	}
	return b.handle(name, id, spec.Task, spec.Epoch), nil
}

// containerConfig is the create request of spec's container; secrets is the host directory of
// its secret files.
func (b *Backend) containerConfig(spec podworker.Spec, secrets string) (*container.Config, *container.HostConfig) {
	env := make([]string, 0, len(spec.Env)+5)
	inside := executor.Config{SecretsDir: SecretsDir, WorkDir: WorkDir}
	// A GitHub slot's secrets directory is writable and it gets no Workload API (Spec.GitHubSlot).
	github := spec.GitHubSlot()
	mounts := []mount.Mount{{Type: mount.TypeBind, Source: secrets, Target: SecretsDir, ReadOnly: !github}}
	if b.spiffeSocket != "" && !github {
		// The agent's directory, not the socket: a socket replaced by a restarted agent stays
		// reachable.
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: filepath.Dir(b.spiffeSocket), Target: SpiffeSocketDir, ReadOnly: true})
		inside.SpiffeEndpointSocket = "unix://" + SpiffeSocketDir + "/" + filepath.Base(b.spiffeSocket)
	}
	own := inside.BackendEnv()
	own["HOME"], own["TMPDIR"] = HomeDir, TmpDir
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		if _, mine := own[k]; !mine {
			env = append(env, k+"="+spec.Env[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(own)) {
		env = append(env, k+"="+own[k])
	}
	size := strconv.FormatInt(b.memory, 10)
	owned := ",mode=0700,uid=" + strconv.Itoa(b.uid) + ",gid=" + strconv.Itoa(b.gid)
	hc := &container.HostConfig{
		NetworkMode:    container.NetworkMode(b.network),
		Privileged:     b.privileged,
		SecurityOpt:    []string{"no-new-privileges:true"},
		ReadonlyRootfs: true,
		Init:           new(true),
		IpcMode:        container.IPCModePrivate,
		Tmpfs: map[string]string{
			TmpDir:  "rw,exec,nosuid,nodev,size=" + size + ",mode=1777",
			WorkDir: "rw,exec,nosuid,nodev,size=" + size + owned,
			HomeDir: "rw,exec,nosuid,nodev,size=" + size + owned,
		},
		Mounts:        mounts,
		RestartPolicy: container.RestartPolicy{Name: container.RestartPolicyDisabled},
		Resources: container.Resources{
			Memory:     b.memory,
			MemorySwap: b.memory,
			NanoCPUs:   b.nanoCPUs,
			PidsLimit:  new(b.pids),
		},
	}
	if !b.privileged {
		hc.CapDrop = []string{"ALL"}
	}
	cfg := &container.Config{
		Image:      b.image,
		User:       b.user,
		Env:        env,
		WorkingDir: WorkDir,
		Labels: map[string]string{
			LabelManaged: "true",
			LabelScope:   b.scope,
			LabelTask:    spec.Task.String(),
			LabelEpoch:   spec.Epoch.String(),
		},
	}
	return cfg, hc
}

// inspect returns the container ref (an id or a name); a missing one gives an error for which
// cerrdefs.IsNotFound is true.
func (b *Backend) inspect(ctx context.Context, ref string) (container.InspectResponse, error) {
	api, err := b.eng.api(ctx)
	if err != nil {
		return container.InspectResponse{}, err
	}
	res, err := api.ContainerInspect(ctx, ref, client.ContainerInspectOptions{})
	if err != nil {
		return container.InspectResponse{}, err
	}
	// The engine always answers both; read a missing one as empty, never dereference nil.
	c := res.Container
	if c.State == nil {
		c.State = new(container.State)
	}
	if c.Config == nil {
		c.Config = new(container.Config)
	}
	return c, nil
}

// ours reports whether c was created by a backend of this scope.
func (b *Backend) ours(c container.InspectResponse) bool {
	return c.Config.Labels[LabelManaged] == "true" && c.Config.Labels[LabelScope] == b.scope
}

// taskOf returns the task and epoch labels of c, zero when they do not parse.
func taskOf(labels map[string]string) (assignment.TaskID, assignment.Epoch) {
	task, epoch, _ := AssignmentOf(labels)
	return task, epoch
}

// AssignmentOf returns the assignment a container's labels (LabelTask, LabelEpoch) name; ok is
// false when either is missing or does not parse.
func AssignmentOf(labels map[string]string) (task assignment.TaskID, epoch assignment.Epoch, ok bool) {
	task, err1 := assignment.ParseTaskID(labels[LabelTask])
	epoch, err2 := assignment.ParseEpoch(labels[LabelEpoch])
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return task, epoch, true
}
