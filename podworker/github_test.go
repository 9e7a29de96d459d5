package podworker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
	"github.com/dynrunner/dynrunner/podworker"
)

var jitBox = func() *sealbox.Box {
	b, err := sealbox.New([]byte("fedcba9876543210fedcba9876543210"))
	if err != nil {
		panic(err)
	}
	return b
}()

var githubEnv = &podworker.GitHub{Box: jitBox,
	Env: executor.GitHubConfig{RunnerBin: "/opt/actions-runner/run.sh", RunnerSHA256: "ab12", LogFormat: "json"}}

// slot claims and configures GitHub slot n with jit as its sealed configuration, and
// dispatches it.
func (r *rig) slot(n int64, jit string) assignment.State {
	r.t.Helper()
	ctx := r.t.Context()
	id := assignment.SlotBase + assignment.TaskID(n)
	st, err := r.log.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: id, At: time.Now(), Actor: "test",
		Backend: assignment.BackendPod, Forge: assignment.ForgeGitHub, ScaleSet: 1, RunnerName: fmt.Sprintf("dynrunner-pod-%d", n),
		Lease: time.Hour, Pickup: 10 * time.Minute}, nil)
	require.NoError(r.t, err)
	sealed, digest, err := sealedtask.SealJIT(jitBox, id, jit)
	require.NoError(r.t, err)
	require.NoError(r.t, r.log.PutTask(ctx, id, sealed))
	st, err = r.log.Apply(ctx, assignment.Event{Transition: assignment.Configured, Task: id, Epoch: st.Epoch(), At: time.Now(), Actor: "test",
		RunnerID: 40 + n, TaskDigest: digest}, &st)
	require.NoError(r.t, err)
	require.NoError(r.t, r.log.Dispatch(ctx, assignment.BackendPod, id, st.Epoch()))
	return st
}

// TestWorkerStartsGitHubSlots: a GitHub slot's environment gets the pinned GitHub runner, the
// slot, and its JIT configuration as its only secret: no capability token, no facade. Its
// runner exiting 0 does not fail the slot (GitHub's JobCompleted says how the job ended); one
// that fails before its job ends fails it.
func TestWorkerStartsGitHubSlots(t *testing.T) {
	r := newRig(t)
	mem := newMem()
	w, _ := r.startWorker(r.log, mem, podworker.Config{Actor: "worker-test", Reap: time.Hour, GitHub: githubEnv,
		ExecutorEnv: map[string]string{executor.EnvFacadeURL: "https://facade:8443"}})

	st := r.slot(1, "eyJqaXQiOiIxIn0=")
	eventually(t, "started", func() bool { return r.phase(st.Task).Phase == assignment.Started })
	got := r.phase(st.Task)
	assert.Empty(t, got.TokenID, "a GitHub slot was issued a capability token")
	id := fmt.Sprintf("%d-%d", st.Task, st.Epoch())
	mem.mu.Lock()
	spec := mem.specs[id]
	mem.mu.Unlock()
	assert.Equal(t, map[string][]byte{executor.JITConfigFile: []byte("eyJqaXQiOiIxIn0=")}, spec.Files, "the slot's secrets are not its JIT configuration alone")
	cfg, err := executor.ParseGitHubEnv(func(k string) string {
		return map[string]string{executor.EnvSecretsDir: "/s", executor.EnvWorkDir: "/w"}[k] + spec.Env[k]
	})
	require.NoError(t, err)
	assert.Equal(t, st.Task, cfg.Task)
	assert.Equal(t, st.Epoch(), cfg.Epoch)
	assert.Equal(t, "/opt/actions-runner/run.sh", cfg.RunnerBin)
	assert.NotContains(t, spec.Env, executor.EnvFacadeURL, "a GitHub slot's environment names a facade")

	// GitHub gave the runner a job; the runner exits 0: the slot waits for JobCompleted.
	_, err = r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Running, Task: st.Task, Epoch: st.Epoch(), At: time.Now(),
		Actor: "test", RunnerID: 41, GitHubJob: "job-1"}, nil)
	require.NoError(t, err)
	eventually(t, "the worker waits on the environment", func() bool { return mem.watchers(id) == 1 })
	mem.exit(id, 0)
	eventually(t, "the worker let the environment go", func() bool { return w.InFlight() == 0 })
	assert.Equal(t, assignment.Running, r.phase(st.Task).Phase, "a runner that exited 0 failed its slot")

	// A runner that fails fails its slot.
	other := r.slot(2, "eyJqaXQiOiIyIn0=")
	otherID := fmt.Sprintf("%d-%d", other.Task, other.Epoch())
	eventually(t, "the worker waits on the second environment", func() bool { return mem.watchers(otherID) == 1 })
	mem.exit(otherID, 1)
	eventually(t, "failed", func() bool { return r.phase(other.Task).Phase == assignment.Failed })
	assert.True(t, r.phase(other.Task).Lost, "a runner that died before its job ended did not lose its environment")

	// A job that exceeds its environment's memory ends it by itself: failed, not lost.
	greedy := r.slot(3, "eyJqaXQiOiIzIn0=")
	greedyID := fmt.Sprintf("%d-%d", greedy.Task, greedy.Epoch())
	eventually(t, "the worker waits on the third environment", func() bool { return mem.watchers(greedyID) == 1 })
	mem.exitWith(greedyID, 137, podworker.ExitOOM)
	eventually(t, "failed", func() bool { return r.phase(greedy.Task).Phase == assignment.Failed })
	assert.False(t, r.phase(greedy.Task).Lost, "a job killed for its memory was recorded as a lost environment")
}

// TestWorkerWithoutGitHubRefusesSlots: a worker not configured for GitHub starts nothing for
// a slot and says why.
func TestWorkerWithoutGitHubRefusesSlots(t *testing.T) {
	r := newRig(t)
	mem := newMem()
	r.run(mem)
	st := r.slot(1, "eyJqaXQiOiIxIn0=")
	eventually(t, "dispatched", func() bool { return r.phase(st.Task).Phase == assignment.Dispatched })
	mem.mu.Lock()
	assert.Zero(t, mem.starts, "an environment started for a GitHub slot without GitHub's configuration")
	mem.mu.Unlock()
}

// TestWorkerFailsSlotsWithoutTheirJIT: a slot dispatched without a JIT configuration of its
// own (none stored, one sealed for another slot, one that is not the configuration
// `configured` recorded) fails at once on its first delivery, saying why, and starts nothing:
// no retry would bring it one. (The retries are an hour apart here: waiting for them fails
// the test.)
func TestWorkerFailsSlotsWithoutTheirJIT(t *testing.T) {
	r := newRig(t)
	mem := newMem()
	r.runWorker(r.log, mem, podworker.Config{Actor: "worker-test", Reap: time.Hour, GitHub: githubEnv, RetryDelay: time.Hour})
	ctx := t.Context()

	// configured claims slot n and records digest as its configuration's, storing sealed (if
	// any) as the configuration, then dispatches it.
	configured := func(n int64, sealed []byte, digest string) assignment.State {
		t.Helper()
		id := assignment.SlotBase + assignment.TaskID(n)
		st, err := r.log.Apply(ctx, assignment.Event{Transition: assignment.Claimed, Task: id, At: time.Now(), Actor: "test",
			Backend: assignment.BackendPod, Forge: assignment.ForgeGitHub, ScaleSet: 1, RunnerName: fmt.Sprintf("dynrunner-pod-%d", n),
			Lease: time.Hour, Pickup: 10 * time.Minute}, nil)
		require.NoError(t, err)
		if sealed != nil {
			require.NoError(t, r.log.PutTask(ctx, id, sealed))
		}
		st, err = r.log.Apply(ctx, assignment.Event{Transition: assignment.Configured, Task: id, Epoch: st.Epoch(), At: time.Now(),
			Actor: "test", RunnerID: 40 + n, TaskDigest: digest}, &st)
		require.NoError(t, err)
		require.NoError(t, r.log.Dispatch(ctx, assignment.BackendPod, id, st.Epoch()))
		return st
	}
	otherSealed, otherDigest, err := sealedtask.SealJIT(jitBox, assignment.SlotBase+99, "eyJqaXQiOiI5OSJ9")
	require.NoError(t, err)
	ownSealed, _, err := sealedtask.SealJIT(jitBox, assignment.SlotBase+3, "eyJqaXQiOiIzIn0=")
	require.NoError(t, err)
	cases := map[string]assignment.State{
		"none stored":                     configured(1, nil, otherDigest),
		"another slot's":                  configured(2, otherSealed, otherDigest),
		"not the one recorded as its own": configured(3, ownSealed, otherDigest),
	}
	for name, st := range cases {
		eventually(t, name+": failed", func() bool { return r.phase(st.Task).Phase == assignment.Failed })
		got := r.phase(st.Task)
		assert.Contains(t, got.Reason, "no JIT configuration of its own", "%s: the reason does not say what is wrong", name)
		assert.False(t, got.Lost, "%s: a slot without its configuration lost an environment it never had", name)
	}
	mem.mu.Lock()
	assert.Zero(t, mem.starts, "an environment started without the slot's own JIT configuration")
	mem.mu.Unlock()

	// A slot with its own configuration still starts.
	good := r.slot(4, "eyJqaXQiOiI0In0=")
	eventually(t, "started", func() bool { return r.phase(good.Task).Phase == assignment.Started })
}
