package fleetbed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
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

// OwnerLabel names the process (its pid) that started a bed's containers and network, so a
// starting bed removes what a killed test process left behind without touching the bed of a
// test running at the same time in another package.
const OwnerLabel = "dynrunner.testbed.owner"

// labels are the docker run / network create flags that mark what bed id starts.
func labels(id string) []string {
	return []string{"--label", Label + "=" + id, "--label", fmt.Sprintf("%s=%d", OwnerLabel, os.Getpid())}
}

// removeLabelled removes every container and network carrying Label=id, and the job
// containers of that bed's pod workers.
func removeLabelled(ctx context.Context, id string) error {
	return removeBeds(ctx, []string{id})
}

// removeOrphans removes the beds whose owner process is gone (a test killed before its
// cleanup ran): their containers, job containers and networks.
func removeOrphans(ctx context.Context) error {
	var orphans []string
	for _, kind := range [][]string{{"ps", "-a"}, {"network", "ls"}} {
		out, err := docker(ctx, append(kind, "--filter", "label="+Label, "--format", `{{.Label "`+Label+`"}} {{.Label "`+OwnerLabel+`"}}`)...)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(out, "\n") {
			id, owner, _ := strings.Cut(strings.TrimSpace(line), " ")
			if id == "" || slices.Contains(orphans, id) || ownerAlive(owner) {
				continue
			}
			orphans = append(orphans, id)
		}
	}
	return removeBeds(ctx, orphans)
}

// ownerAlive reports whether the process named by an OwnerLabel value still runs.
func ownerAlive(owner string) bool {
	pid, err := strconv.Atoi(owner)
	if err != nil || pid <= 0 {
		return false // no owner: a bed of an older version of this package
	}
	return syscall.Kill(pid, 0) == nil
}

func removeBeds(ctx context.Context, ids []string) error {
	var errs []string
	for _, id := range ids {
		for _, filter := range []string{"label=" + Label + "=" + id, "label=dynrunner.scope=" + scopeOf(id)} {
			ids, err := docker(ctx, "ps", "-aq", "--filter", filter)
			if err != nil {
				return err
			}
			if ids != "" {
				if _, err := docker(ctx, append([]string{"rm", "-f", "-v"}, strings.Fields(ids)...)...); err != nil {
					errs = append(errs, err.Error())
				}
			}
		}
		nets, err := docker(ctx, "network", "ls", "-q", "--filter", "label="+Label+"="+id)
		if err != nil {
			return err
		}
		if nets != "" {
			if _, err := docker(ctx, append([]string{"network", "rm"}, strings.Fields(nets)...)...); err != nil {
				errs = append(errs, err.Error())
			}
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
