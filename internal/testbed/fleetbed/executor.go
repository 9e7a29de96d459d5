package fleetbed

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// ExecutorImage builds the docker backend's executor image with scripts/executor-image.sh,
// found from root (the module's root directory), and returns its ID.
func ExecutorImage(ctx context.Context, root string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "executor-image.sh"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("scripts/executor-image.sh: %w\n%s", err, Tail(stderr.String(), 40))
	}
	id := strings.TrimSpace(stdout.String())
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(id) {
		return "", fmt.Errorf("scripts/executor-image.sh printed %q, want an image ID\n%s", id, Tail(stderr.String(), 40))
	}
	return id, nil
}
