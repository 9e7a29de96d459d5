package podworker

import (
	"context"
	"errors"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Spec is everything a backend needs to start the environment of one assignment.
type Spec struct {
	Task  assignment.TaskID
	Epoch assignment.Epoch
	// Env is the executor's non-secret configuration, as environment variables.
	Env map[string]string
	// Files are secret files (capability token, SVID) the executor reads; the backend places
	// them with mode 0600 in a directory whose path it passes in DYNRUNNER_SECRETS_DIR.
	Files map[string][]byte
}

// GitHubSlot reports whether s starts a GitHub slot's executor (executor.IsGitHub of its Env).
// A slot's executor removes the JIT configuration from its secrets directory once read, before
// the runner (and the job) starts, so backends give it that directory writable; its runner
// talks to GitHub, not to the facade, so it gets no Workload API.
func (s Spec) GitHubSlot() bool {
	return executor.IsGitHub(func(k string) string { return s.Env[k] })
}

// Handle identifies a running environment. The worker records it in the event log (the
// `started` transition) and gives it back to the backend after a restart to re-attach.
type Handle struct {
	Backend string            `json:"backend"`
	ID      string            `json:"id"`
	Task    assignment.TaskID `json:"task_id"`
	Epoch   assignment.Epoch  `json:"epoch"`
	// Data is opaque backend state (process id and start time, Pod UID, container id).
	Data map[string]string `json:"data,omitempty"`
}

// Exit is how an environment ended.
type Exit struct {
	// Code is the executor's exit code, or -1 when the backend cannot tell (an adopted process).
	Code int
	// Reason says why, for humans: "exited", "killed", "deleted", "evicted", or ExitOOM and
	// ExitDeadline, the two the worker does not count as a lost environment.
	Reason string
}

// Exit reasons of an environment whose job exceeded the environment's limits: the job ended
// it, the environment was not lost.
const (
	ExitOOM      = "oom"      // the executor was killed for exceeding its memory limit
	ExitDeadline = "deadline" // the environment ran past its deadline (a Pod's activeDeadlineSeconds)
)

// Backend creates, watches and destroys one-shot environments.
type Backend interface {
	// Name is the backend's configured name: "local", "docker", "kubernetes".
	Name() string
	// Start creates the environment and returns once it has been created (not once the job ran).
	Start(ctx context.Context, spec Spec) (Handle, error)
	// Wait blocks until the environment ends or ctx is done. It works for handles from Start and
	// for handles recovered after a restart (Nomad's RecoverTask).
	Wait(ctx context.Context, h Handle) (Exit, error)
	// Destroy stops the environment and removes everything it created. It is idempotent:
	// destroying an environment that is already gone returns nil.
	Destroy(ctx context.Context, h Handle) error
	// List returns every environment of this backend that exists now, so the worker can adopt
	// those a live assignment owns and reap the rest.
	List(ctx context.Context) ([]Handle, error)
}

// Notifier is implemented by backends that learn of their environments' ends from one stream
// for all of them (the engine's event stream, an informer's watch) rather than from one
// blocking Wait each. The worker then holds no goroutine and no context per running
// environment: it registers each one it watches and is called back when it ends.
type Notifier interface {
	// Notify calls ended exactly once, on a goroutine of its own (the backend never waits
	// for it), with what Wait would return: the environment's Exit once it ended, or an error
	// wrapping ErrNotFound once it is gone; or with cause, as it is, once stop(cause) was
	// called before either (context.Canceled for a nil cause). Like Wait it works for
	// handles from Start and adopted ones, and reports an environment that ended before
	// Notify was called. stop may be called from any goroutine, any number of times, also
	// after ended was called (it then does nothing). A registration keeps no context of its
	// own: the worker ends them all with stop when it stops.
	Notify(h Handle, ended func(Exit, error)) (stop func(cause error))
}

// Await calls ended once with what b.Wait returns for h: through b's Notify when b is a
// Notifier, else from a goroutine that waits in Wait. Once stop(cause) is called before the
// environment ended, ended gets cause.
func Await(b Backend, h Handle, ended func(Exit, error)) (stop func(cause error)) {
	if n, ok := b.(Notifier); ok {
		return n.Notify(h, ended)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		exit, err := b.Wait(ctx, h)
		if cause := context.Cause(ctx); cause != nil && err != nil {
			err = cause
		}
		ended(exit, err)
	}()
	return cancel
}

// ErrNotFound reports a handle whose environment no longer exists.
var ErrNotFound = errors.New("podworker: environment not found")

// Diagnoser is implemented by backends that can tell why an environment's executor failed.
// The worker adds the answer to the failure reason the forge shows.
type Diagnoser interface {
	// Diagnose returns the executor's (or launcher's) last error line, which starts with
	// ExecutorErrorPrefix (LauncherErrorPrefix), or
	// "" when there is none. It never returns the job's own output.
	Diagnose(ctx context.Context, h Handle) (string, error)
}

// The lines the executor and the microVM launcher print when they fail start with these.
const (
	ExecutorErrorPrefix = "dynrunner executor: "
	LauncherErrorPrefix = "dynrunner launcher: "
)
