package autoscale

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
)

// Labels of the containers the Docker engine actuator starts.
const (
	// LabelGroup names the template a container was made from: the actuator manages the
	// containers carrying its template's name, and only those.
	LabelGroup = "dynrunner.autoscale.template"
	// LabelHost is the container's host name: the Host of its worker's heartbeat.
	LabelHost = "dynrunner.autoscale.host"
)

// Container is one pod-worker container on the engine.
type Container struct {
	Name, Host string
	Running    bool
	Created    time.Time
}

// Engine starts, lists and removes pod-worker containers.
type Engine interface {
	// List returns the containers this actuator started, running or not.
	List(ctx context.Context) ([]Container, error)
	// Start creates and starts one new pod-worker container and returns its name.
	Start(ctx context.Context) (string, error)
	// Remove stops (SIGTERM, then SIGKILL after grace) and removes a container.
	Remove(ctx context.Context, name string, grace time.Duration) error
}

// Docker is the Engine of one Docker engine: every container it starts copies the
// configuration of a template container (image, command, environment, user, mounts, resource
// limits, restart policy, networks and their aliases), with a host name of its own and the
// actuator's labels.
type Docker struct {
	cli       *client.Client
	template  string
	perWorker int
}

// NewDocker returns the Engine of the Docker engine at socket, copying template, and checks
// the template: it must exist, run only the pod worker (COMPONENTS=pod-worker) and publish no
// host port (two copies could not both bind it).
func NewDocker(ctx context.Context, socket, template string) (*Docker, error) {
	cli, err := client.New(client.WithHost("unix://" + socket))
	if err != nil {
		return nil, fmt.Errorf("autoscale: engine at %s: %w", socket, err)
	}
	d := &Docker{cli: cli, template: template}
	t, err := d.inspectTemplate(ctx)
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	if err := checkTemplate(template, t); err != nil {
		_ = cli.Close()
		return nil, err
	}
	d.perWorker = envInt(t.Config.Env, "POD_CONCURRENCY")
	return d, nil
}

// PerWorker is the template's POD_CONCURRENCY (one new worker's capacity), or 0 when it does
// not set it or sets no number.
func (d *Docker) PerWorker() int { return d.perWorker }

// envInt is the integer value of name in env (KEY=value entries), or 0.
func envInt(env []string, name string) int {
	n := 0
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			n, _ = strconv.Atoi(v)
		}
	}
	return max(n, 0)
}

// Close closes the engine's client.
func (d *Docker) Close() error { return d.cli.Close() }

func (d *Docker) inspectTemplate(ctx context.Context) (container.InspectResponse, error) {
	res, err := d.cli.ContainerInspect(ctx, d.template, client.ContainerInspectOptions{})
	if cerrdefs.IsNotFound(err) {
		return container.InspectResponse{}, fmt.Errorf("autoscale: AUTOSCALE_DOCKER_TEMPLATE=%s: no such container; create it with `docker create --name %s ... COMPONENTS=pod-worker ...` (see docs/operations.md)", d.template, d.template)
	}
	if err != nil {
		return container.InspectResponse{}, fmt.Errorf("autoscale: inspect the template %s: %w", d.template, err)
	}
	if res.Container.Config == nil || res.Container.HostConfig == nil {
		return container.InspectResponse{}, fmt.Errorf("autoscale: the template %s has no configuration", d.template)
	}
	return res.Container, nil
}

// checkTemplate refuses a template whose copies could not run side by side as pod workers.
func checkTemplate(name string, t container.InspectResponse) error {
	var components string
	for _, kv := range t.Config.Env {
		if v, ok := strings.CutPrefix(kv, "COMPONENTS="); ok {
			components = v
		}
	}
	if strings.TrimSpace(components) != "pod-worker" {
		return fmt.Errorf("autoscale: the template %s runs COMPONENTS=%q: want COMPONENTS=pod-worker (the actuator starts and drains pod workers only)", name, components)
	}
	if len(t.HostConfig.PortBindings) > 0 || t.HostConfig.PublishAllPorts {
		return fmt.Errorf("autoscale: the template %s publishes host ports: its copies cannot all bind them; reach the workers on a Docker network instead", name)
	}
	if t.HostConfig.NetworkMode.IsHost() || t.HostConfig.NetworkMode.IsContainer() {
		return fmt.Errorf("autoscale: the template %s uses the network of the host or of another container (%s): its copies would share one HTTP_LISTEN port and host name; put it on a Docker network", name, t.HostConfig.NetworkMode)
	}
	if t.HostConfig.UTSMode.IsHost() {
		return fmt.Errorf("autoscale: the template %s shares the host's UTS namespace: its copies need host names of their own (their workers' heartbeats carry them)", name)
	}
	return nil
}

// List returns the containers made from the template.
func (d *Docker) List(ctx context.Context) ([]Container, error) {
	res, err := d.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: client.Filters{}.Add("label", LabelGroup+"="+d.template)})
	if err != nil {
		return nil, fmt.Errorf("autoscale: list the pod workers: %w", err)
	}
	out := make([]Container, 0, len(res.Items))
	for _, c := range res.Items {
		name := ""
		if len(c.Names) > 0 {
			name = strings.TrimPrefix(c.Names[0], "/")
		}
		out = append(out, Container{Name: name, Host: c.Labels[LabelHost], Created: time.Unix(c.Created, 0),
			Running: c.State == container.StateRunning || c.State == container.StateRestarting || c.State == container.StatePaused})
	}
	return out, nil
}

// Start creates a copy of the template, called <template>-<8 hex digits> (also its host
// name, when short enough), and starts it.
func (d *Docker) Start(ctx context.Context) (string, error) {
	t, err := d.inspectTemplate(ctx)
	if err != nil {
		return "", err
	}
	if err := checkTemplate(d.template, t); err != nil {
		return "", err
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	suffix := hex.EncodeToString(rnd[:])
	name := d.template + "-" + suffix
	host := name
	if len(host) > 63 {
		host = "pod-worker-" + suffix
	}
	cfg := *t.Config
	cfg.Hostname, cfg.Domainname = host, ""
	// The template's image itself, not whatever its tag names by now.
	cfg.Image = t.Image
	cfg.Labels = maps.Clone(cfg.Labels)
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	// Compose would take copies of a compose-made template for its own replicas and scale
	// them away without a drain.
	maps.DeleteFunc(cfg.Labels, func(k, _ string) bool { return strings.HasPrefix(k, "com.docker.compose.") })
	cfg.Labels[LabelGroup], cfg.Labels[LabelHost] = d.template, host
	cfg.Env = slices.Clone(cfg.Env)
	hc := *t.HostConfig
	hc.ContainerIDFile = "" // the template's --cidfile exists already
	// The template's other networks, with their aliases (never its addresses).
	nc := &network.NetworkingConfig{EndpointsConfig: map[string]*network.EndpointSettings{}}
	if t.NetworkSettings != nil {
		for name, ep := range t.NetworkSettings.Networks {
			if ep == nil {
				continue
			}
			// Engines before API 1.45 list the template's short id among its aliases.
			aliases := slices.DeleteFunc(slices.Clone(ep.Aliases), func(a string) bool { return strings.HasPrefix(t.ID, a) })
			nc.EndpointsConfig[name] = &network.EndpointSettings{Aliases: aliases, DriverOpts: maps.Clone(ep.DriverOpts), GwPriority: ep.GwPriority}
		}
	}
	created, err := d.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: name, Config: &cfg, HostConfig: &hc, NetworkingConfig: nc})
	if err != nil {
		return "", fmt.Errorf("autoscale: create pod worker %s from %s: %w", name, d.template, err)
	}
	if _, err := d.cli.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		_, _ = d.cli.ContainerRemove(context.WithoutCancel(ctx), created.ID, client.ContainerRemoveOptions{Force: true})
		return "", fmt.Errorf("autoscale: start pod worker %s: %w", name, err)
	}
	return name, nil
}

// Remove stops the container (SIGTERM, SIGKILL after grace) and removes it; one already gone
// is no error.
func (d *Docker) Remove(ctx context.Context, name string, grace time.Duration) error {
	secs := int(grace.Seconds())
	_, err := d.cli.ContainerStop(ctx, name, client.ContainerStopOptions{Timeout: &secs})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("autoscale: stop pod worker %s: %w", name, err)
	}
	_, err = d.cli.ContainerRemove(ctx, name, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("autoscale: remove pod worker %s: %w", name, err)
	}
	return nil
}
