package docker

import (
	"context"
	"fmt"
	"strings"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/events"
	"github.com/moby/moby/client"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Running is a running container of a scope's environments, as Inventory lists it.
type Running struct {
	// ContainerID is the engine's 64-hex-digit container id.
	ContainerID string
	Task        assignment.TaskID
	Epoch       assignment.Epoch
}

// Inventory lists the running environment containers of one scope on an engine, for
// components beside the controller (the SPIRE registrar). It creates and removes nothing.
type Inventory struct {
	eng   *engine
	scope string
}

// NewInventory returns an Inventory of the containers of scope (DefaultScope when empty) on
// the engine at socket (DefaultSocket when empty; "unix://" is accepted).
func NewInventory(socket, scope string) (*Inventory, error) {
	socket = strings.TrimPrefix(socket, "unix://")
	if socket == "" {
		socket = DefaultSocket
	}
	if !strings.HasPrefix(socket, "/") {
		return nil, fmt.Errorf("%w: socket %q: want the absolute path of the engine's unix socket", ErrInvalidConfig, socket)
	}
	if scope == "" {
		scope = DefaultScope
	}
	if !scopeRe.MatchString(scope) {
		return nil, fmt.Errorf("%w: scope %q: want 1 to 32 lowercase letters and digits", ErrInvalidConfig, scope)
	}
	eng, err := newEngine(socket)
	if err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	return &Inventory{eng: eng, scope: scope}, nil
}

// Scope returns the inventory's scope.
func (i *Inventory) Scope() string { return i.scope }

// Running lists the scope's running containers whose assignment labels parse (AssignmentOf).
func (i *Inventory) Running(ctx context.Context) ([]Running, error) {
	api, err := i.eng.api(ctx)
	if err != nil {
		return nil, fmt.Errorf("docker: list running: %w", err)
	}
	cs, err := api.ContainerList(ctx, client.ContainerListOptions{
		Filters: make(client.Filters).
			Add("label", LabelManaged+"=true", LabelScope+"="+i.scope).
			Add("status", string(container.StateRunning)),
	})
	if err != nil {
		return nil, fmt.Errorf("docker: list running: %w", err)
	}
	out := make([]Running, 0, len(cs.Items))
	for _, c := range cs.Items {
		// The filters, checked.
		if !containerIDRe.MatchString(c.ID) || c.State != container.StateRunning ||
			c.Labels[LabelManaged] != "true" || c.Labels[LabelScope] != i.scope {
			continue
		}
		if task, epoch, ok := AssignmentOf(c.Labels); ok {
			out = append(out, Running{ContainerID: c.ID, Task: task, Epoch: epoch})
		}
	}
	return out, nil
}

// Watch calls changed whenever a container of the scope starts or ends, until ctx ends or
// the engine's event stream breaks; it returns nil when ctx ends. Callers list again on each
// call, and call Watch again (after a pause) when it returns an error.
func (i *Inventory) Watch(ctx context.Context, changed func()) error {
	api, err := i.eng.api(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("docker: watch: %w", err)
	}
	// Cancelled on return, so the client's reader of the stream ends with Watch.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	evs := api.Events(ctx, client.EventsListOptions{Filters: make(client.Filters).
		Add("type", string(events.ContainerEventType)).
		Add("label", LabelManaged+"=true", LabelScope+"="+i.scope).
		Add("event", "start", "die", "destroy", "stop", "kill", "pause", "unpause"),
	})
	for {
		select {
		case <-evs.Messages:
			changed()
		case err := <-evs.Err:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("docker: watch: %w", err)
		}
	}
}

// Close releases the inventory's idle connections. It is idempotent.
func (i *Inventory) Close() error {
	i.eng.close()
	return nil
}
