package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/envlock"
	"github.com/dynrunner/dynrunner/podworker"
)

const backendName = "local"

// Defaults for the optional Config fields.
const (
	DefaultGrace        = 10 * time.Second
	DefaultPollInterval = 200 * time.Millisecond
)

// killWait bounds how long Destroy waits for processes to die after SIGKILL.
const killWait = 5 * time.Second

// Stable log field names.
const (
	logKeyBackend = "backend"
	logKeyTaskID  = "task_id"
	logKeyEpoch   = "epoch"
	logKeyEnv     = "env"
	logKeyPID     = "pid"
)

// ErrInvalidSpec reports a Spec the backend refuses (bad task or epoch, unsafe secret file
// name, malformed environment variable); retrying cannot help.
var ErrInvalidSpec = errors.New("local: invalid spec")

// ErrInvalidHandle reports a Handle that is not a local one or whose ID is not a safe directory
// name.
var ErrInvalidHandle = errors.New("local: invalid handle")

// Config configures a Backend. The caller fills it; the backend reads no environment variables.
type Config struct {
	// Root holds one subdirectory per environment, for example $STATE_DIR/envs. It must be an
	// absolute path; New creates it (mode 0700) when missing.
	Root string
	// Command is the executor's executable and arguments, for example
	// [os.Executable(), "executor"]. A name without a slash is looked up in the controller's PATH.
	Command []string
	// BaseEnv is the environment ("KEY=value") every executor starts with. The controller's own
	// environment is never inherited implicitly.
	BaseEnv []string
	// Grace is how long Destroy waits after SIGTERM before it sends SIGKILL (DefaultGrace when
	// zero).
	Grace time.Duration
	// PollInterval is how often Wait checks an adopted process (DefaultPollInterval when zero).
	PollInterval time.Duration
	// Users, when set, runs each environment under a uid of its own from its range, with no
	// access to the controller's files or to other environments (see the package
	// documentation). It needs root. Nil: environments run as the controller's user.
	Users *Users
	// Programs are further executables the environments run, for example the Gitea runner.
	// With Users, New copies them, as it does the executor, where the environments' users can
	// run them; Program returns the path environments use.
	Programs []string
	// Log receives the backend's events.
	Log zerolog.Logger
}

// Backend runs each environment as a child process. It is safe for concurrent use, and several
// Backends (in one process or in successive controller processes) may share a Root.
type Backend struct {
	root    string
	path    string
	args    []string
	baseEnv []string
	grace   time.Duration
	poll    time.Duration
	log     zerolog.Logger
	// users is nil when environments run as the controller's user.
	users *Users
	// programs maps Config.Programs to the paths environments run them at.
	programs map[string]string

	mu       sync.Mutex
	children map[string]*child // by environment ID: processes this Backend started
}

var _ podworker.Backend = (*Backend)(nil)

// child is a process this Backend started and reaps.
type child struct {
	ref  procRef
	done chan struct{} // closed once the process was reaped and exit set
	exit podworker.Exit
}

// New validates cfg and returns a Backend. It creates Root when missing.
func New(cfg Config) (*Backend, error) {
	if !procSupported {
		return nil, errors.New("local: the local backend needs Linux /proc")
	}
	if !filepath.IsAbs(cfg.Root) {
		return nil, fmt.Errorf("local: root %q is not an absolute path", cfg.Root)
	}
	if len(cfg.Command) == 0 || cfg.Command[0] == "" {
		return nil, errors.New("local: no executor command")
	}
	path, err := exec.LookPath(cfg.Command[0])
	if err != nil {
		return nil, fmt.Errorf("local: executor %q: %w", cfg.Command[0], err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return nil, fmt.Errorf("local: executor %q: %w", cfg.Command[0], err)
	}
	for _, kv := range cfg.BaseEnv {
		if err := checkEnvEntry(kv); err != nil {
			return nil, fmt.Errorf("local: base environment: %w", err)
		}
	}
	if cfg.Grace < 0 || cfg.PollInterval < 0 {
		return nil, errors.New("local: negative grace or poll interval")
	}
	root := filepath.Clean(cfg.Root)
	var users *Users
	if cfg.Users != nil {
		u, err := checkUsers(*cfg.Users)
		if err != nil {
			return nil, err
		}
		users = &u
	}
	if err := os.MkdirAll(filepath.Join(root, locksDir), 0o700); err != nil {
		return nil, fmt.Errorf("local: root: %w", err)
	}
	programs := make(map[string]string, len(cfg.Programs))
	for _, p := range cfg.Programs {
		programs[p] = p
	}
	if users != nil {
		// The environments' users pass through the root (not list it) to their own directories.
		if err := os.Chmod(root, 0o711); err != nil {
			return nil, fmt.Errorf("local: root: %w", err)
		}
		if err := checkReachable(root); err != nil {
			return nil, err
		}
		shared, err := shareExecutables(root, append([]string{path}, cfg.Programs...))
		if err != nil {
			return nil, fmt.Errorf("local: %w", err)
		}
		path = shared[path]
		for _, p := range cfg.Programs {
			programs[p] = shared[p]
		}
	}
	b := &Backend{
		root:     root,
		path:     path,
		args:     append([]string(nil), cfg.Command...),
		baseEnv:  append([]string(nil), cfg.BaseEnv...),
		grace:    cfg.Grace,
		poll:     cfg.PollInterval,
		log:      cfg.Log.With().Str(logKeyBackend, backendName).Logger(),
		users:    users,
		programs: programs,
		children: make(map[string]*child),
	}
	if b.grace == 0 {
		b.grace = DefaultGrace
	}
	if b.poll == 0 {
		b.poll = DefaultPollInterval
	}
	return b, nil
}

// Name returns "local".
func (b *Backend) Name() string { return backendName }

// Program returns the path at which environments run p, one of Config.Programs: a copy they
// can execute with Config.Users, else p itself.
func (b *Backend) Program(p string) string {
	if c, ok := b.programs[p]; ok {
		return c
	}
	return p
}

// checkHandle validates h and returns its environment ID.
func (b *Backend) checkHandle(h podworker.Handle) (string, error) {
	if h.Backend != backendName {
		return "", fmt.Errorf("local: handle of backend %q: %w", h.Backend, ErrInvalidHandle)
	}
	if !validName(h.ID, false) {
		return "", fmt.Errorf("local: handle id %q: %w", h.ID, ErrInvalidHandle)
	}
	return h.ID, nil
}

func (b *Backend) dir(id string) string { return filepath.Join(b.root, id) }

// marker is the environment entry every process of environment id inherits.
func (b *Backend) marker(id string) string { return executor.EnvDirEntry(b.dir(id)) }

// ownChild returns the child this Backend started for id, if any; with a non-nil ref only if it
// is that process.
func (b *Backend) ownChild(id string, ref *procRef) *child {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.children[id]
	if c == nil || (ref != nil && c.ref != *ref) {
		return nil
	}
	return c
}

// Wait blocks until the environment's executor has exited or ctx is done. For a process this
// Backend started it returns the exit code; for an adopted one the code recorded by the
// controller that reaped it, else -1. It returns an error wrapping podworker.ErrNotFound when
// the environment was already destroyed. For a Handle without process data (see List) it waits
// until no process of the environment runs.
func (b *Backend) Wait(ctx context.Context, h podworker.Handle) (podworker.Exit, error) {
	id, err := b.checkHandle(h)
	if err != nil {
		return podworker.Exit{}, err
	}
	ref, hasRef, err := refFromData(h.Data)
	if err != nil {
		return podworker.Exit{}, errorf("wait", id, err)
	}
	if hasRef {
		if c := b.ownChild(id, &ref); c != nil {
			select {
			case <-c.done:
				return c.exit, nil
			case <-ctx.Done():
				return podworker.Exit{}, errorf("wait", id, ctx.Err())
			}
		}
	}
	root, err := os.OpenRoot(b.root)
	if err != nil {
		return podworker.Exit{}, errorf("wait", id, err)
	}
	defer root.Close()
	exists := func() bool {
		_, err := root.Lstat(id)
		return err == nil
	}
	running := ref.alive
	if !hasRef {
		uid, err := b.uidOf(ctx, b.dir(id))
		if err != nil {
			return podworker.Exit{}, errorf("wait", id, err)
		}
		running = func() bool {
			procs, err := scanProcs(b.marker(id), uid)
			if err != nil {
				return false
			}
			for _, p := range procs {
				if p.marked {
					return true
				}
			}
			return false
		}
	}
	if !exists() && !running() {
		return podworker.Exit{}, errorf("wait", id, podworker.ErrNotFound)
	}
	for running() {
		if err := clock.Sleep(ctx, b.poll); err != nil {
			return podworker.Exit{}, errorf("wait", id, err)
		}
	}
	if hasRef {
		if exit, ok := readExit(root, id, ref); ok {
			return exit, nil
		}
	}
	if !exists() {
		return podworker.Exit{Code: -1, Reason: "deleted"}, nil
	}
	return podworker.Exit{Code: -1, Reason: "exited"}, nil
}

// Destroy stops every process of the environment (SIGTERM, then SIGKILL after Config.Grace)
// and removes its directory. When ctx ends during the grace period it sends SIGKILL at once;
// the kill and the removal then still complete. Destroying an environment that is gone, or
// never existed, returns nil.
func (b *Backend) Destroy(ctx context.Context, h podworker.Handle) error {
	id, err := b.checkHandle(h)
	if err != nil {
		return err
	}
	var refs []procRef
	ref, ok, err := refFromData(h.Data)
	if err != nil {
		return errorf("destroy", id, err)
	}
	if ok {
		refs = append(refs, ref)
	}
	unlock, err := b.lockEnv(ctx, id)
	if err != nil {
		return errorf("destroy", id, err)
	}
	found, err := b.destroyLocked(ctx, id, refs)
	if err != nil {
		unlock(false)
		return errorf("destroy", id, err)
	}
	unlock(true)
	if found {
		b.envLog(h).Info().Msg("environment destroyed")
	}
	return nil
}

// envLog returns the backend's logger with the fields that identify environment h.
func (b *Backend) envLog(h podworker.Handle) *zerolog.Logger {
	c := b.log.With().Str(logKeyEnv, h.ID)
	if h.Task != 0 {
		c = c.Int64(logKeyTaskID, int64(h.Task)).Uint64(logKeyEpoch, uint64(h.Epoch))
	}
	if ref, ok, _ := refFromData(h.Data); ok {
		c = c.Int(logKeyPID, ref.pid)
	}
	l := c.Logger()
	return &l
}

// destroyLocked stops the processes of environment id and removes its directory. refs are
// processes the caller knows of; those in handle.json and those this Backend started are added.
// It reports whether it found anything to stop or remove. The caller holds the environment's
// lock.
func (b *Backend) destroyLocked(ctx context.Context, id string, refs []procRef) (bool, error) {
	if root, err := os.OpenRoot(b.root); err == nil {
		if h, err := readHandle(root, id); err == nil {
			if ref, ok, _ := refFromData(h.Data); ok {
				refs = append(refs, ref)
			}
		}
		_ = root.Close()
	}
	c := b.ownChild(id, nil)
	if c != nil {
		refs = append(refs, c.ref)
	}
	// The uid is the environment's while the registry says so, which it does until the
	// directory is gone: every process of it is the environment's.
	uid, err := b.uidOf(context.WithoutCancel(ctx), b.dir(id))
	if err != nil {
		return false, err
	}
	stopped, err := b.stop(ctx, id, refs, uid)
	if err != nil {
		return true, err
	}
	if c != nil {
		// The reaper returns as soon as the process is dead; wait for it so that it does not
		// write exit.json into a directory being removed.
		select {
		case <-c.done:
		case <-time.After(killWait):
			return true, fmt.Errorf("executor %d not reaped", c.ref.pid)
		}
		b.mu.Lock()
		if b.children[id] == c {
			delete(b.children, id)
		}
		b.mu.Unlock()
	}
	removed, err := envlock.RemoveDir(b.root, id)
	if err == nil {
		err = b.releaseUID(context.WithoutCancel(ctx), uid, b.dir(id))
	}
	return stopped > 0 || removed || c != nil || uid != noUID, err
}
