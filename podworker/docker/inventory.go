package docker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

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
	return &Inventory{eng: newEngine(socket), scope: scope}, nil
}

// Scope returns the inventory's scope.
func (i *Inventory) Scope() string { return i.scope }

// Running lists the scope's running containers whose assignment labels parse (AssignmentOf).
func (i *Inventory) Running(ctx context.Context) ([]Running, error) {
	filters, _ := json.Marshal(map[string][]string{
		"label":  {LabelManaged + "=true", LabelScope + "=" + i.scope},
		"status": {"running"},
	})
	var cs []struct {
		ID     string            `json:"Id"`
		State  string            `json:"State"`
		Labels map[string]string `json:"Labels"`
	}
	if err := i.eng.call(ctx, http.MethodGet, "/containers/json", url.Values{"filters": {string(filters)}}, nil, &cs); err != nil {
		return nil, fmt.Errorf("docker: list running: %w", err)
	}
	out := make([]Running, 0, len(cs))
	for _, c := range cs {
		// The filters, checked.
		if !containerIDRe.MatchString(c.ID) || c.State != "running" ||
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
	filters, _ := json.Marshal(map[string][]string{
		"type":  {"container"},
		"label": {LabelManaged + "=true", LabelScope + "=" + i.scope},
		"event": {"start", "die", "destroy", "stop", "kill", "pause", "unpause"},
	})
	resp, err := i.eng.do(ctx, http.MethodGet, "/events", url.Values{"filters": {string(filters)}}, nil)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("docker: watch: %w", err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Type   string `json:"Type"`
			Action string `json:"Action"`
		}
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("docker: watch: %w", err)
		}
		changed()
	}
}

// Close releases the inventory's idle connections. It is idempotent.
func (i *Inventory) Close() error {
	i.eng.close()
	return nil
}
