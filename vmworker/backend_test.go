package vmworker_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/launcher"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/vmworker"
)

// launches is a stand-in for the launcher processes: it records the spec of each Start and
// starts nothing.
type launches struct {
	mu    sync.Mutex
	specs []podworker.Spec
}

func (l *launches) Name() string { return "local" }

func (l *launches) Start(_ context.Context, spec podworker.Spec) (podworker.Handle, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.specs = append(l.specs, spec)
	return podworker.Handle{Backend: "local", ID: spec.Task.String() + "-" + spec.Epoch.String(), Task: spec.Task, Epoch: spec.Epoch}, nil
}

func (l *launches) Wait(context.Context, podworker.Handle) (podworker.Exit, error) {
	return podworker.Exit{}, podworker.ErrNotFound
}

func (l *launches) Destroy(context.Context, podworker.Handle) error { return nil }

func (l *launches) List(context.Context) ([]podworker.Handle, error) { return nil, nil }

var _ vmworker.Launcher = (*launches)(nil)

// TestLaunchEnvParses: the environment the VM backend gives a launcher is what
// launcher.ParseFlags reads: the settings of all launches, and the launch's own instance,
// nonce endpoint and a nonce that redeems, for that instance, the assignment's token.
func TestLaunchEnvParses(t *testing.T) {
	r := newRig(t)
	dir := t.TempDir()
	all := launcher.DefaultConfig()
	all.Image, all.Kernel, all.Root = filepath.Join(dir, "base.qcow2"), filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "vms")
	all.Hypervisor, all.CPUs, all.MemoryMiB = launcher.HypervisorQEMU, 1, 256
	for _, f := range []string{all.Image, all.Kernel} {
		require.NoError(t, os.WriteFile(f, []byte("x"), 0o644))
	}
	procs := &launches{}
	const endpointURL = "http://10.213.0.1:7001"
	b, err := vmworker.NewBackend(procs, r.nonces, endpointURL, all.Environ())
	require.NoError(t, err)
	st := r.claimVM(t, 5)
	specEnv := executor.Config{Task: 5, Epoch: st.Epoch(), ForgeURL: "https://gitea.example.com"}.AssignmentEnv()
	h, err := b.Start(t.Context(), podworker.Spec{Task: 5, Epoch: st.Epoch(), Env: specEnv,
		Files: map[string][]byte{podworker.TokenFile: []byte("drc1.secret")}})
	require.NoError(t, err)
	assert.Equal(t, st.Task, h.Task)

	require.Len(t, procs.specs, 1)
	spec := procs.specs[0]
	assert.Empty(t, spec.Files, "nothing secret reaches the launcher's directory")
	for k, v := range specEnv {
		assert.Equal(t, v, spec.Env[k], "the worker's %s", k)
	}
	got, err := launcher.ParseFlags(nil, func(k string) string { return spec.Env[k] }, io.Discard)
	require.NoError(t, err)
	want := all
	want.InstanceID, want.Nonce = got.InstanceID, got.Nonce
	want.Endpoint, err = launcher.ParseEndpoint(endpointURL)
	require.NoError(t, err)
	assert.Equal(t, want, got)
	assert.Equal(t, endpointURL, spec.Env[launcher.EnvEndpoint])
	task, epoch, cred, err := r.nonces.Redeem(t.Context(), got.InstanceID.String(), got.Nonce.Reveal())
	require.NoError(t, err)
	assert.Equal(t, st.Task, task)
	assert.Equal(t, st.Epoch(), epoch)
	assert.Equal(t, vmworker.Credential{Token: "drc1.secret"}, cred)
}

func TestNewBackendRefusesEndpoint(t *testing.T) {
	for _, ep := range []string{"", "https://10.213.0.1:7001", "http://10.213.0.1", "http://vm.example:7001"} {
		_, err := vmworker.NewBackend(&launches{}, nil, ep, nil)
		assert.ErrorIs(t, err, launcher.ErrInvalidConfig, "endpoint %q", ep)
	}
}
