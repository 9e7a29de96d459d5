package fleetbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ImportImage loads an image holding the static binary bin as its entrypoint (cmd its
// arguments) and an empty /tmp, tagged tag, as the bed's own images are built; it returns the
// image's ID. A benchmark runs its own test binary (built with CGO_ENABLED=0) this way.
func ImportImage(ctx context.Context, bin, tag string, cmd ...string) (string, error) {
	return importImage(ctx, bin, tag, cmd)
}

// Command returns `docker run` of a new container called name (its host name and alias on
// the bed's network; role says what it is) from image, attached: the container's stdout and
// stderr are the command's. flags go before the image (-v, -e, ...), args after it. The
// command is not started; [Bed.Close] removes the container, [Container.Remove] earlier.
func (b *Bed) Command(ctx context.Context, name, role string, flags []string, image string, args ...string) (*exec.Cmd, *Container) {
	c := &Container{Name: name, Role: role, docker: b.dockerName(name), bed: b}
	run := b.runArgs(c, slices.Concat(flags, []string{image}, args)...)
	// runArgs is `run -d ...`: this one stays attached.
	run = append([]string{"run"}, run[2:]...)
	return exec.CommandContext(ctx, "docker", run...), c
}

// Stop is `docker stop`: SIGTERM, and SIGKILL after grace.
func (c *Container) Stop(ctx context.Context, grace time.Duration) error {
	_, err := docker(ctx, "stop", "-t", strconv.Itoa(int(grace.Seconds())), c.docker)
	return err
}

// Remove removes the container, running or not.
func (c *Container) Remove(ctx context.Context) error {
	_, err := docker(ctx, "rm", "-f", "-v", c.docker)
	return err
}

// CPUTime is the CPU time (user and system) the container's processes have used, read from
// its cgroup on the host (cgroup v1 cpuacct or v2 cpu.stat, cgroupfs or systemd driver).
func (c *Container) CPUTime(ctx context.Context) (time.Duration, error) {
	id, err := docker(ctx, "inspect", "-f", "{{.Id}}", c.docker)
	if err != nil {
		return 0, err
	}
	for _, p := range []string{
		"/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage",
		"/sys/fs/cgroup/cpu,cpuacct/docker/" + id + "/cpuacct.usage",
		"/sys/fs/cgroup/cpuacct/system.slice/docker-" + id + ".scope/cpuacct.usage",
	} {
		if b, err := os.ReadFile(p); err == nil {
			ns, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return time.Duration(ns), err
		}
	}
	for _, p := range []string{
		"/sys/fs/cgroup/docker/" + id + "/cpu.stat",
		"/sys/fs/cgroup/system.slice/docker-" + id + ".scope/cpu.stat",
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return time.Duration(us) * time.Microsecond, err
			}
		}
	}
	return 0, fmt.Errorf("fleetbed: no cgroup CPU accounting found for %s under %s", c.Name, filepath.Clean("/sys/fs/cgroup"))
}
