package fleetbed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// Label marks everything a bed starts; its value is the bed's id.
const Label = "dynrunner.testbed"

// docker runs the docker CLI, as an operator would, and returns its trimmed stdout.
func docker(ctx context.Context, args ...string) (string, error) {
	return dockerIn(ctx, nil, args...)
}

// dockerIn is docker with stdin.
func dockerIn(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// NeedDocker returns an error that says what to start when the Docker engine does not answer.
func NeedDocker(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := docker(ctx, "version", "--format", "{{.Server.Version}}"); err != nil {
		return fmt.Errorf("fleetbed: the Docker engine does not answer (start it with `systemctl start docker`, and run as root): %w", err)
	}
	return nil
}

// removeLabelled removes every container and network carrying Label=id ("" matches any
// value: the leftovers of every earlier bed).
func removeLabelled(ctx context.Context, id string) error {
	filter := "label=" + Label
	if id != "" {
		filter += "=" + id
	}
	var errs []string
	ids, err := docker(ctx, "ps", "-aq", "--filter", filter)
	if err != nil {
		return err
	}
	if ids != "" {
		if _, err := docker(ctx, append([]string{"rm", "-f", "-v"}, strings.Fields(ids)...)...); err != nil {
			errs = append(errs, err.Error())
		}
	}
	nets, err := docker(ctx, "network", "ls", "-q", "--filter", filter)
	if err != nil {
		return err
	}
	if nets != "" {
		if _, err := docker(ctx, append([]string{"network", "rm"}, strings.Fields(nets)...)...); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("fleetbed: remove what the bed started: %s", strings.Join(errs, "; "))
	}
	return nil
}

// dockerCombined runs the docker CLI and returns stdout and stderr together.
func dockerCombined(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}
