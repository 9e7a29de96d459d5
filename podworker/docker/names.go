package docker

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
)

const namePrefix = "dynrunner-"

var (
	// containerNameRe is Docker's rule for container names; such a name is also a safe single
	// directory entry (it starts with a letter or digit, so it is never "." or "..").
	containerNameRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$`)
	containerIDRe   = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// envPrefix is what every container name of the backend's scope starts with.
func (b *Backend) envPrefix() string {
	if b.scope == DefaultScope {
		return namePrefix
	}
	return namePrefix + b.scope + "-"
}

// envName is the container name, Handle.ID and StateDir entry of an assignment's environment.
func (b *Backend) envName(task assignment.TaskID, epoch assignment.Epoch) string {
	return podworker.EnvName(b.envPrefix(), task, epoch)
}

// parseEnvName is the inverse of envName; ok is false for any other name.
func (b *Backend) parseEnvName(name string) (assignment.TaskID, assignment.Epoch, bool) {
	return podworker.ParseEnvName(b.envPrefix(), name)
}

// checkHandle validates h and returns the reference the engine knows it by: the container id
// from Data when present, else the container name.
func (b *Backend) checkHandle(h podworker.Handle) (string, error) {
	if h.Backend != backendName {
		return "", fmt.Errorf("docker: handle of backend %q: %w", h.Backend, ErrInvalidHandle)
	}
	if !containerNameRe.MatchString(h.ID) {
		return "", fmt.Errorf("docker: handle id %q: %w", h.ID, ErrInvalidHandle)
	}
	id, ok := h.Data[dataContainerID]
	if !ok {
		return h.ID, nil
	}
	if !containerIDRe.MatchString(id) {
		return "", fmt.Errorf("docker: handle %s: container id %q: %w", h.ID, id, ErrInvalidHandle)
	}
	return id, nil
}

// handle is the Handle of the container id named name.
func (b *Backend) handle(name, id string, task assignment.TaskID, epoch assignment.Epoch) podworker.Handle {
	return podworker.Handle{
		Backend: backendName,
		ID:      name,
		Task:    task,
		Epoch:   epoch,
		Data:    map[string]string{dataContainerID: id},
	}
}

// validName reports whether name is safe as a secret file name: not empty, no separator, no
// "..", no NUL. Dot-files are allowed.
func validName(name string) bool {
	return name != "" && len(name) <= 255 && !strings.ContainsAny(name, "/\x00") &&
		!strings.Contains(name, "..") && name != "."
}

// validateSpec checks everything Start takes from outside.
func validateSpec(spec podworker.Spec) error {
	if spec.Task <= 0 || spec.Epoch == 0 {
		return fmt.Errorf("%w: task %d epoch %d", ErrInvalidSpec, spec.Task, spec.Epoch)
	}
	for k, v := range spec.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%w: environment variable %q", ErrInvalidSpec, k)
		}
	}
	for name := range spec.Files {
		if !validName(name) {
			return fmt.Errorf("%w: secret file name %q", ErrInvalidSpec, name)
		}
	}
	return nil
}
