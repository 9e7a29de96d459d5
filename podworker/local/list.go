package local

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/dynrunner/dynrunner/podworker"
)

// List returns a handle for every entry of Root (dot-entries excepted), in name order. An entry
// without a valid handle.json gets a Handle with ID set to its name, Task and Epoch parsed from
// the name when possible, and nil Data (see the package documentation).
func (b *Backend) List(ctx context.Context) ([]podworker.Handle, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("local: list: %w", err)
	}
	entries, err := os.ReadDir(b.root)
	if err != nil {
		return nil, fmt.Errorf("local: list: %w", err)
	}
	root, err := os.OpenRoot(b.root)
	if err != nil {
		return nil, fmt.Errorf("local: list: %w", err)
	}
	defer root.Close()
	var out []podworker.Handle
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		if h, err := readHandle(root, name); err == nil {
			out = append(out, h)
			continue
		}
		h := podworker.Handle{Backend: backendName, ID: name}
		if task, epoch, ok := parseEnvID(name); ok {
			h.Task, h.Epoch = task, epoch
		}
		out = append(out, h)
	}
	return out, nil
}
