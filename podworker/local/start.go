package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/envlock"
	"github.com/dynrunner/dynrunner/podworker"
)

// Start creates the environment of spec and starts the executor in it. When the environment
// already exists and its executor runs (a retried dispatch), Start returns its handle and starts
// nothing. When it exists but its executor is gone, Start wipes it and starts afresh.
func (b *Backend) Start(ctx context.Context, spec podworker.Spec) (podworker.Handle, error) {
	if err := validateSpec(spec); err != nil {
		return podworker.Handle{}, err
	}
	id := envID(spec.Task, spec.Epoch)
	unlock, err := b.lockEnv(ctx, id)
	if err != nil {
		return podworker.Handle{}, errorf("start", id, err)
	}
	h, ok := b.running(id)
	if ok {
		unlock(false)
		b.envLog(h).Info().Msg("environment already running")
		return h, nil
	}
	// Whatever is there is left over from an earlier attempt: stop it and remove it.
	if _, err := b.destroyLocked(ctx, id, nil); err != nil {
		unlock(false)
		return podworker.Handle{}, errorf("start", id, fmt.Errorf("wipe: %w", err))
	}
	if err := ctx.Err(); err != nil {
		unlock(true)
		return podworker.Handle{}, errorf("start", id, err)
	}
	h, err = b.create(ctx, id, spec)
	if err != nil {
		unlock(true)
		return podworker.Handle{}, errorf("start", id, err)
	}
	unlock(false)
	b.envLog(h).Info().Msg("environment started")
	return h, nil
}

// running returns the handle of environment id if its executor runs.
func (b *Backend) running(id string) (podworker.Handle, bool) {
	root, err := os.OpenRoot(b.root)
	if err != nil {
		return podworker.Handle{}, false
	}
	defer root.Close()
	h, err := readHandle(root, id)
	if err != nil {
		return podworker.Handle{}, false
	}
	ref, _, _ := refFromData(h.Data)
	if c := b.ownChild(id, &ref); c != nil {
		select {
		case <-c.done:
			return podworker.Handle{}, false
		default:
			return h, true
		}
	}
	return h, ref.alive()
}

// create builds the directory of environment id and starts the executor, under a uid of its
// own with Config.Users. On error it leaves nothing behind.
func (b *Backend) create(ctx context.Context, id string, spec podworker.Spec) (h podworker.Handle, err error) {
	dir := b.dir(id)
	uid := noUID
	if b.users != nil {
		u, err := b.claimDir(ctx, dir)
		if err != nil {
			return h, err
		}
		uid = int(u)
	} else if err := os.Mkdir(dir, 0o700); err != nil {
		return h, err
	}
	var c *child
	defer func() {
		if err == nil {
			return
		}
		if c != nil {
			_ = signalGroup(c.ref.pgid, syscall.SIGKILL)
			<-c.done
			b.mu.Lock()
			delete(b.children, id)
			b.mu.Unlock()
		}
		if uid != noUID {
			// The executor may have forked before it was killed.
			if _, serr := b.stop(context.WithoutCancel(ctx), id, nil, uid); serr != nil {
				err = errors.Join(err, fmt.Errorf("clean up: %w", serr))
				return // keep the claim: the uid may still run something
			}
		}
		if _, rerr := envlock.RemoveDir(b.root, id); rerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", rerr))
			return
		}
		if rerr := b.releaseUID(context.WithoutCancel(ctx), uid, dir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", rerr))
		}
	}()
	// The environment's user owns these four and nothing else: the directory above them, and
	// handle.json, exit.json and executor.log in it, stay the controller's.
	own := func(p string) error {
		if uid == noUID {
			return nil
		}
		return os.Lchown(p, uid, uid)
	}
	for _, sub := range []string{secretsDir, workDir, homeDir, tmpDir} {
		p := filepath.Join(dir, sub)
		if err := os.Mkdir(p, 0o700); err != nil {
			return h, err
		}
		if err := own(p); err != nil {
			return h, err
		}
	}
	for name, data := range spec.Files {
		p := filepath.Join(dir, secretsDir, name)
		if err := writeSecret(p, data); err != nil {
			return h, fmt.Errorf("secret %q: %w", name, err)
		}
		if err := own(p); err != nil {
			return h, fmt.Errorf("secret %q: %w", name, err)
		}
	}
	logf, err := os.OpenFile(filepath.Join(dir, logFile),
		os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return h, err
	}
	defer logf.Close() // the child keeps its own copy of the descriptor

	cmd := &exec.Cmd{
		Path:   b.path,
		Args:   b.args,
		Env:    b.env(dir, spec.Env),
		Dir:    filepath.Join(dir, workDir),
		Stdout: logf,
		Stderr: logf,
		// A new session makes the executor the leader of its own process group (pgid == pid)
		// without a controlling terminal. No Pdeathsig: the environment must outlive the
		// controller.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if uid != noUID {
		cmd.SysProcAttr.Credential = credential(uint32(uid))
	}
	if err := cmd.Start(); err != nil {
		return h, err
	}
	pid := cmd.Process.Pid
	// Not reaped yet, so /proc/<pid> exists even if the executor already exited.
	st, serr := readStat(pid)
	c = &child{ref: procRef{pid: pid, pgid: pid, start: st.Start}, done: make(chan struct{})}
	b.mu.Lock()
	b.children[id] = c
	b.mu.Unlock()
	go b.reap(id, cmd, c)
	if serr != nil {
		return h, fmt.Errorf("executor %d: %w", pid, serr)
	}

	h = podworker.Handle{
		Backend: backendName,
		ID:      id,
		Task:    spec.Task,
		Epoch:   spec.Epoch,
		Data:    c.ref.data(dir),
	}
	if uid != noUID {
		h.Data[dataUID] = strconv.Itoa(uid)
	}
	data, err := json.Marshal(h)
	if err != nil {
		return h, err
	}
	if err := writeFileAtomic(dir, handleFile, data); err != nil {
		return h, fmt.Errorf("%s: %w", handleFile, err)
	}
	return h, nil
}

// reap waits for the executor, records how it ended for Wait (in memory and in exit.json, for
// a controller that adopts the environment later) and closes c.done.
func (b *Backend) reap(id string, cmd *exec.Cmd, c *child) {
	defer close(c.done)
	err := cmd.Wait()
	c.exit = exitOf(cmd.ProcessState, err)
	rec, _ := json.Marshal(exitRecord{PID: c.ref.pid, StartTime: c.ref.start, Code: c.exit.Code, Reason: c.exit.Reason})
	if werr := writeFileAtomic(b.dir(id), exitFile, rec); werr != nil && !errors.Is(werr, fs.ErrNotExist) {
		b.log.Warn().Err(werr).Str(logKeyEnv, id).Msg("record executor exit")
	}
	task, epoch, _ := parseEnvID(id)
	b.envLog(podworker.Handle{ID: id, Task: task, Epoch: epoch}).Info().Int(logKeyPID, c.ref.pid).
		Int("code", c.exit.Code).Str("reason", c.exit.Reason).Msg("executor exited")
}

func exitOf(ps *os.ProcessState, err error) podworker.Exit {
	if ps == nil {
		return podworker.Exit{Code: -1, Reason: fmt.Sprintf("lost: %v", err)}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return podworker.Exit{Code: -1, Reason: "killed"}
	}
	return podworker.Exit{Code: ps.ExitCode(), Reason: "exited"}
}

// env is BaseEnv, then the spec's variables in key order, then the backend's own: the
// environment's marker (executor.EnvDirEntry), its directories (executor.Config.BackendEnv) in
// key order, HOME and TMPDIR. exec keeps the last value of a duplicate key.
func (b *Backend) env(dir string, specEnv map[string]string) []string {
	env := slices.Clone(b.baseEnv)
	for _, k := range slices.Sorted(maps.Keys(specEnv)) {
		env = append(env, k+"="+specEnv[k])
	}
	env = append(env, executor.EnvDirEntry(dir))
	own := executor.Config{SecretsDir: filepath.Join(dir, secretsDir), WorkDir: filepath.Join(dir, workDir)}.BackendEnv()
	for _, k := range slices.Sorted(maps.Keys(own)) {
		env = append(env, k+"="+own[k])
	}
	return append(env,
		"HOME="+filepath.Join(dir, homeDir),
		"TMPDIR="+filepath.Join(dir, tmpDir),
	)
}

func writeSecret(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if err := f.Chmod(0o600); err != nil { // exact, whatever the umask
		_ = f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// validateSpec checks everything Start takes from outside.
func validateSpec(spec podworker.Spec) error {
	if spec.Task <= 0 || spec.Epoch == 0 {
		return fmt.Errorf("%w: task %d epoch %d", ErrInvalidSpec, spec.Task, spec.Epoch)
	}
	for k, v := range spec.Env {
		if strings.Contains(k, "=") {
			return fmt.Errorf("%w: environment key %q", ErrInvalidSpec, k)
		}
		if err := checkEnvEntry(k + "=" + v); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidSpec, err)
		}
	}
	for name := range spec.Files {
		if !validName(name, true) {
			return fmt.Errorf("%w: secret file name %q", ErrInvalidSpec, name)
		}
	}
	return nil
}

// checkEnvEntry checks one "KEY=value" entry.
func checkEnvEntry(kv string) error {
	k, _, ok := strings.Cut(kv, "=")
	if !ok || k == "" || strings.ContainsRune(kv, 0) {
		return fmt.Errorf("environment entry %q", kv)
	}
	return nil
}
