package vmworker

import (
	"context"
	"fmt"
	"maps"

	"github.com/google/uuid"

	"github.com/dynrunner/dynrunner/launcher"
	"github.com/dynrunner/dynrunner/podworker"
)

// Launcher is how the VM backend runs one microVM: `dynrunner launcher` as a child process
// in its own process group (podworker/local), configured through DYNRUNNER_LAUNCH_*
// variables. The launcher outlives a controller crash like any local environment, and tears
// its VM down (TAP, disk, seed, hypervisor) when its process group is stopped.
type Launcher interface {
	podworker.Backend
}

// Backend boots one microVM per job. It issues the nonce the guest redeems for its
// credential (a Gitea assignment's capability token or a GitHub slot's JIT configuration:
// SpecCredential), so the credential never reaches the VM's seed or disk.
type Backend struct {
	procs    Launcher
	nonces   *Nonces
	endpoint launcher.Endpoint
	launch   map[string]string
}

var (
	_ podworker.Backend   = (*Backend)(nil)
	_ podworker.Diagnoser = (*Backend)(nil)
)

// NewBackend returns a VM backend running launchers through procs. endpoint is the nonce
// endpoint's URL as guests reach it, http://<ip>:<port> (launcher.ParseEndpoint); launch holds
// the static DYNRUNNER_LAUNCH_* settings (image, kernel, hypervisor, bridge, resources:
// launcher.Config.Environ).
func NewBackend(procs Launcher, nonces *Nonces, endpoint string, launch map[string]string) (*Backend, error) {
	ep, err := launcher.ParseEndpoint(endpoint)
	if err != nil {
		return nil, fmt.Errorf("vmworker: nonce endpoint: %w", err)
	}
	return &Backend{procs: procs, nonces: nonces, endpoint: ep, launch: maps.Clone(launch)}, nil
}

// Name implements podworker.Backend: "local" (VM_BACKEND=local), the name of the launcher
// processes' backend, which every handle carries.
func (b *Backend) Name() string { return b.procs.Name() }

// Start issues a nonce for the assignment's credential and starts a launcher.
func (b *Backend) Start(ctx context.Context, spec podworker.Spec) (podworker.Handle, error) {
	cred, err := SpecCredential(spec)
	if err != nil {
		return podworker.Handle{}, err
	}
	own, err := b.newLaunch()
	if err != nil {
		return podworker.Handle{}, err
	}
	if err := b.nonces.Issue(ctx, own.Nonce.Reveal(), own.InstanceID.String(), spec.Task, spec.Epoch, cred); err != nil {
		return podworker.Handle{}, err
	}
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, b.launch)
	maps.Copy(env, own.InstanceEnv())
	// Nothing secret is written to the launcher's directory: the nonce is useless without
	// the bridge, and redeems once.
	return b.procs.Start(ctx, podworker.Spec{Task: spec.Task, Epoch: spec.Epoch, Env: env, Files: map[string][]byte{}})
}

// newLaunch returns a launch's own settings: a new instance id and nonce, and the nonce
// endpoint.
func (b *Backend) newLaunch() (launcher.Config, error) {
	instance, err := NewInstanceID()
	if err != nil {
		return launcher.Config{}, err
	}
	nonce, err := NewNonce()
	if err != nil {
		return launcher.Config{}, err
	}
	c := launcher.Config{Endpoint: b.endpoint}
	if c.InstanceID, err = launcher.ParseInstanceID(instance); err != nil {
		return launcher.Config{}, fmt.Errorf("vmworker: instance id: %w", err)
	}
	if c.Nonce, err = launcher.ParseNonce(nonce); err != nil {
		return launcher.Config{}, fmt.Errorf("vmworker: nonce: %w", err)
	}
	return c, nil
}

// Wait implements podworker.Backend.
func (b *Backend) Wait(ctx context.Context, h podworker.Handle) (podworker.Exit, error) {
	return b.procs.Wait(ctx, h)
}

// Destroy stops the launcher, which tears its VM down.
func (b *Backend) Destroy(ctx context.Context, h podworker.Handle) error {
	return b.procs.Destroy(ctx, h)
}

// List implements podworker.Backend.
func (b *Backend) List(ctx context.Context) ([]podworker.Handle, error) { return b.procs.List(ctx) }

// Diagnose returns the launcher's failure line, if any.
func (b *Backend) Diagnose(ctx context.Context, h podworker.Handle) (string, error) {
	if d, ok := b.procs.(podworker.Diagnoser); ok {
		return d.Diagnose(ctx, h)
	}
	return "", nil
}

// NewInstanceID returns a new microVM instance id: a random UUID (version 4) in canonical
// form, the only form the nonce endpoint accepts. Every VM backend uses it.
func NewInstanceID() (string, error) {
	u, err := uuid.NewRandom()
	if err != nil {
		return "", fmt.Errorf("vmworker: instance id: %w", err)
	}
	return u.String(), nil
}
