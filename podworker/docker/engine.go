package docker

import (
	"context"
	"errors"
	"fmt"
	"sync"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/client"
	"github.com/moby/moby/client/pkg/versions"
)

// minAPIVersion is the oldest Engine API the backend speaks (Docker 20.10). The client
// negotiates the engine's own version, capped at the newest it knows (client.MaxAPIVersion).
const minAPIVersion = "1.41"

// engine is the Engine API client of a Backend or an Inventory: the official client over the
// engine's unix socket, handed out only once the engine is known to speak minAPIVersion or
// newer.
type engine struct {
	socket string
	cli    *client.Client

	mu    sync.Mutex
	ready bool // the API version is negotiated and recent enough
}

func newEngine(socket string) (*engine, error) {
	// No client timeout: wait and stop calls block for as long as their context allows. The
	// client reads no environment variables unless asked to.
	cli, err := client.New(client.WithHost("unix://" + socket))
	if err != nil {
		return nil, fmt.Errorf("engine at %s: %w", socket, err)
	}
	return &engine{socket: socket, cli: cli}, nil
}

func (e *engine) close() { _ = e.cli.Close() }

// api returns the client once the API version is negotiated: the engine's own, capped at
// client.MaxAPIVersion. It refuses an engine older than minAPIVersion with ErrEngineTooOld,
// on every call, and negotiates again on the next call after any failure.
func (e *engine) api(ctx context.Context) (*client.Client, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ready {
		return e.cli, nil
	}
	ping, err := e.cli.Ping(ctx, client.PingOptions{NegotiateAPIVersion: true, ForceNegotiate: true})
	// The client itself accepts engines down to client.MinAPIVersion: the backend's own bound
	// comes first.
	if server := ping.APIVersion; server != "" && versions.LessThan(server, minAPIVersion) {
		return nil, fmt.Errorf("engine at %s speaks API %s, need %s (Docker 20.10) or newer: %w", e.socket, server, minAPIVersion, ErrEngineTooOld)
	}
	if err != nil {
		return nil, fmt.Errorf("engine at %s: %w", e.socket, err)
	}
	if ping.APIVersion == "" {
		return nil, fmt.Errorf("engine at %s: ping names no API version", e.socket)
	}
	e.ready = true
	return e.cli, nil
}

// transient reports whether err may go away by itself: the engine could not be reached, the
// connection broke, or the engine answered with a server error (5xx). The engine's other
// answers (4xx) and ErrEngineTooOld are final.
func transient(err error) bool {
	return err != nil && !errors.Is(err, ErrEngineTooOld) && !refused(err)
}

// refused reports whether err is the engine's answer with a client error status (4xx), as the
// client classifies them.
func refused(err error) bool {
	return cerrdefs.IsNotFound(err) || cerrdefs.IsInvalidArgument(err) || cerrdefs.IsConflict(err) ||
		cerrdefs.IsFailedPrecondition(err) || cerrdefs.IsUnauthorized(err) ||
		cerrdefs.IsPermissionDenied(err) || cerrdefs.IsResourceExhausted(err)
}
