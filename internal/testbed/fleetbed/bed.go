package fleetbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/forge/gitea"
	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// Roles of the bed's containers.
const (
	RoleNATS      = "nats"
	RoleScheduler = "scheduler"
	RoleFacade    = "facade"
	RolePodWorker = "pod-worker"
)

// Ports inside the containers.
const (
	natsClientPort  = 4222
	natsMonitorPort = 8222
	httpPort        = 9464
	facadePort      = 8443
)

// natsUser is the NATS user every dynrunner process logs in as.
const natsUser = "dynrunner"

// Options configure [Start].
type Options struct {
	// Dir holds the bed's files (secrets, state directories, Gitea's state); it must be an
	// absolute path every container can mount, e.g. t.TempDir().
	Dir string
	// Tools are the real Gitea and runner binaries (devforge.FindTools).
	Tools devforge.Tools
	// ExecutorImage is the docker pod backend's executor image (scripts/executor-image.sh).
	ExecutorImage string
	// Schedulers, Facades and PodWorkers are how many of each run, each in its own container
	// (default 2 each; a negative count starts none).
	Schedulers, Facades, PodWorkers int
	// PodConcurrency is each pod worker's POD_CONCURRENCY (default 2).
	PodConcurrency int
	// Env is added to every dynrunner container's environment (LEASE_SECS, PICKUP_SECS, ...).
	Env []string
	// SchedulerEnv is added to the schedulers' environment after Env; SchedulerDocker mounts
	// the Docker engine's socket into them (for AUTOSCALE=docker).
	SchedulerEnv    []string
	SchedulerDocker bool
	// PodWorkerTemplate, when not nil, has Start create (never start) a pod-worker container
	// configured as the bed's pod workers are, with these variables added, before the
	// schedulers, and name it to them as AUTOSCALE_DOCKER_TEMPLATE (Bed.Template).
	PodWorkerTemplate []string
	// Output receives the bed's progress lines; nil discards them.
	Output io.Writer
	// NATSOnly starts the network and the NATS cluster alone: no Gitea, no dynrunner
	// containers (Tools, ExecutorImage and the counts are then ignored). A benchmark adds its
	// own containers with [Bed.Command].
	NATSOnly bool
}

// Container is one of the bed's containers: a host of its own.
type Container struct {
	// Name is the container's host name and its alias on the bed's network (nats-1,
	// scheduler-2, ...).
	Name string
	Role string
	// docker is the container's name at the engine.
	docker string
	bed    *Bed
}

// Bed is a running split deployment. Close removes it.
type Bed struct {
	ID      string
	Network string
	// Gateway is the host's address on Network, where Gitea listens.
	Gateway netip.Addr
	Forge   *devforge.Forge
	Images  Images
	NATS    []*Container
	// Dynrunner are the dynrunner containers, schedulers first, then facades, then pod workers.
	Dynrunner []*Container
	// Scope is POD_DOCKER_SCOPE of the pod workers: the label of their job containers.
	Scope string
	// Template is the name at the engine of the pod-worker template (Options.PodWorkerTemplate).
	Template string
	// PodStateDir is the pod workers' STATE_DIR (one directory, the same path in the host and
	// in every pod worker: the engine mounts each job's secrets from it).
	PodStateDir string

	opts      Options
	secrets   string
	natsPass  string
	closeOnce sync.Once
}

// Start builds the images (once per process), creates the network, starts Gitea on its
// gateway, registers the resident runner, and starts the NATS cluster and the dynrunner
// containers, returning once every one is ready. With Options.NATSOnly it starts only the
// network and the NATS cluster.
func Start(ctx context.Context, opts Options) (b *Bed, err error) {
	if !filepath.IsAbs(opts.Dir) {
		return nil, errors.New("fleetbed: Options.Dir must be an absolute path")
	}
	if opts.ExecutorImage == "" && !opts.NATSOnly {
		return nil, errors.New("fleetbed: Options.ExecutorImage is required")
	}
	for _, n := range []*int{&opts.Schedulers, &opts.Facades, &opts.PodWorkers, &opts.PodConcurrency} {
		if *n == 0 {
			*n = 2
		}
	}
	if opts.Output == nil {
		opts.Output = io.Discard
	}
	if err := NeedDocker(ctx); err != nil {
		return nil, err
	}
	// What a killed test process left behind (never the bed of a test running beside this one).
	if err := removeOrphans(ctx); err != nil {
		return nil, err
	}
	began := time.Now()
	var im Images
	if opts.NATSOnly {
		im.NATS, err = BuildNATSImage(ctx)
	} else {
		im, err = BuildImages(ctx)
	}
	if err != nil {
		return nil, err
	}
	b = &Bed{ID: randomHex(4), Images: im, opts: opts}
	b.Network = "fleetbed-" + b.ID
	b.Scope = scopeOf(b.ID)
	b.logf("images built in %s", time.Since(began).Round(100*time.Millisecond))
	defer func() {
		if err != nil {
			_ = b.Close()
			b = nil
		}
	}()
	if _, err := docker(ctx, append(append([]string{"network", "create"}, labels(b.ID)...), b.Network)...); err != nil {
		return b, err
	}
	gw, err := docker(ctx, "network", "inspect", "-f", "{{range .IPAM.Config}}{{.Gateway}}{{end}}", b.Network)
	if err != nil {
		return b, err
	}
	if b.Gateway, err = netip.ParseAddr(gw); err != nil {
		return b, fmt.Errorf("fleetbed: network %s has gateway %q", b.Network, gw)
	}
	if opts.NATSOnly {
		b.natsPass = randomHex(24)
	} else {
		b.Forge, err = devforge.Start(ctx, opts.Tools, devforge.Options{Dir: filepath.Join(opts.Dir, "gitea"), Addr: b.Gateway.String()})
		if err != nil {
			return b, err
		}
		if err := b.writeSecrets(ctx); err != nil {
			return b, err
		}
	}
	if err := b.startNATS(ctx); err != nil {
		return b, err
	}
	b.logf("nats cluster ready after %s", time.Since(began).Round(100*time.Millisecond))
	if opts.NATSOnly {
		return b, nil
	}
	if err := b.startDynrunner(ctx); err != nil {
		return b, err
	}
	b.logf("bed %s ready after %s", b.ID, time.Since(began).Round(100*time.Millisecond))
	return b, nil
}

// Close removes every container (job containers of the bed's scope included), the network,
// and stops Gitea. It is idempotent.
func (b *Bed) Close() error {
	var err error
	b.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var errs []error
		errs = append(errs, removeLabelled(ctx, b.ID))
		if b.Forge != nil {
			errs = append(errs, b.Forge.Close())
		}
		if b.PodStateDir != "" {
			errs = append(errs, os.RemoveAll(b.PodStateDir))
		}
		err = errors.Join(errs...)
	})
	return err
}

func (b *Bed) logf(format string, args ...any) {
	fmt.Fprintf(b.opts.Output, "fleetbed: "+format+"\n", args...)
}

// writeSecrets writes the files every dynrunner process reads: the NATS password, the task
// and capability keys, the resident runner's credentials (registered once: every scheduler
// and facade acts as that one runner), and the development CA, shared so that the facades
// trust the SVIDs the pod workers issue.
func (b *Bed) writeSecrets(ctx context.Context) error {
	b.secrets = filepath.Join(b.opts.Dir, "secrets")
	if err := os.MkdirAll(b.secrets, 0o700); err != nil {
		return err
	}
	tok, err := b.Forge.RunnerRegistrationToken(ctx, "")
	if err != nil {
		return err
	}
	creds, err := gitea.Register(ctx, http.DefaultClient, b.Forge.URL(), tok, "dynrunner-fleetbed", []string{"self-hosted", "pod"}, "fleetbed")
	if err != nil {
		return err
	}
	b.natsPass = randomHex(24)
	for name, data := range map[string]string{
		"nats-password":  b.natsPass,
		"task.key":       randomHex(32),
		"capability.key": randomHex(32),
		"runner-uuid":    creds.UUID,
		"runner-token":   creds.Token,
	} {
		if err := secretfile.WriteNew(filepath.Join(b.secrets, name), []byte(data)); err != nil {
			return err
		}
	}
	td, err := spiffeid.TrustDomainFromString("dynrunner.local")
	if err != nil {
		return err
	}
	_, err = workload.LoadOrCreateDevCA(filepath.Join(b.opts.Dir, "ca"), td)
	return err
}

func randomHex(n int) string {
	p := make([]byte, n)
	_, _ = rand.Read(p)
	return hex.EncodeToString(p)
}

// startNATS starts the three-node JetStream cluster and waits until every node is healthy.
func (b *Bed) startNATS(ctx context.Context) error {
	const nodes = 3
	var routes []string
	for i := 1; i <= nodes; i++ {
		routes = append(routes, fmt.Sprintf("nats://nats-%d:6222", i))
	}
	for i := 1; i <= nodes; i++ {
		name := fmt.Sprintf("nats-%d", i)
		conf := filepath.Join(b.opts.Dir, name+".conf")
		if err := os.WriteFile(conf, []byte(natsConf(name, routes, b.natsPass)), 0o600); err != nil {
			return err
		}
		c := &Container{Name: name, Role: RoleNATS, docker: b.dockerName(name), bed: b}
		if _, err := docker(ctx, b.runArgs(c, "-v", conf+":/nats.conf:ro", b.Images.NATS, "--config", "/nats.conf")...); err != nil {
			return err
		}
		b.NATS = append(b.NATS, c)
	}
	for _, c := range b.NATS {
		if err := c.waitHTTP(ctx, natsMonitorPort, "/healthz", 2*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

func natsConf(name string, routes []string, pass string) string {
	return fmt.Sprintf(`server_name: %s
listen: 0.0.0.0:%d
http: 0.0.0.0:%d
jetstream { store_dir: /data, max_memory_store: 256MB, max_file_store: 4GB }
cluster { name: fleetbed, listen: 0.0.0.0:6222, routes: [%s] }
authorization { users: [ { user: %s, password: %q } ] }
`, name, natsClientPort, natsMonitorPort, strings.Join(routes, ", "), natsUser, pass)
}

// NATSURL is the cluster's client URL as the containers name it.
func (b *Bed) NATSURL() string {
	var urls []string
	for _, c := range b.NATS {
		urls = append(urls, fmt.Sprintf("nats://%s:%d", c.Name, natsClientPort))
	}
	return strings.Join(urls, ",")
}

// NATSHostURL is the cluster's client URL by the nodes' current addresses, for the test
// process on the host; NATSCredentials the user and password.
func (b *Bed) NATSHostURL(ctx context.Context) (string, error) {
	var urls []string
	for _, c := range b.NATS {
		ip, err := c.Addr(ctx)
		if err != nil {
			continue // partitioned or killed: the others serve
		}
		urls = append(urls, "nats://"+net.JoinHostPort(ip.String(), fmt.Sprint(natsClientPort)))
	}
	if len(urls) == 0 {
		return "", errors.New("fleetbed: no NATS node has an address")
	}
	return strings.Join(urls, ","), nil
}

// NATSCredentials are the user and password the dynrunner processes log in with.
func (b *Bed) NATSCredentials() (user, password string) { return natsUser, b.natsPass }

// FacadeURLs are the facades' URLs as job containers reach them.
func (b *Bed) FacadeURLs() []string {
	var urls []string
	for _, c := range b.Dynrunner {
		if c.Role == RoleFacade {
			urls = append(urls, fmt.Sprintf("https://%s:%d", c.Name, facadePort))
		}
	}
	return urls
}

// startDynrunner starts the schedulers, facades and pod workers and waits for each to be ready.
func (b *Bed) startDynrunner(ctx context.Context) error {
	b.PodStateDir = filepath.Join(b.opts.Dir, "pod-state")
	for _, r := range []struct {
		role string
		n    int
	}{{RoleScheduler, b.opts.Schedulers}, {RoleFacade, b.opts.Facades}, {RolePodWorker, b.opts.PodWorkers}} {
		for i := 1; i <= r.n; i++ {
			name := fmt.Sprintf("%s-%d", r.role, i)
			b.Dynrunner = append(b.Dynrunner, &Container{Name: name, Role: r.role, docker: b.dockerName(name), bed: b})
		}
	}
	facades := strings.Join(b.FacadeURLs(), ",")
	if b.opts.PodWorkerTemplate != nil {
		var err error
		if b.Template, err = b.podWorkerTemplate(ctx, "pod-worker-template", b.opts.PodWorkerTemplate...); err != nil {
			return err
		}
		b.opts.SchedulerEnv = append(b.opts.SchedulerEnv, "AUTOSCALE_DOCKER_TEMPLATE="+b.Template)
	}
	for _, c := range b.Dynrunner {
		if err := b.runDynrunner(ctx, c, facades); err != nil {
			return err
		}
	}
	for _, c := range b.Dynrunner {
		if err := c.WaitReady(ctx, 2*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

func (b *Bed) runDynrunner(ctx context.Context, c *Container, facades string) error {
	args, err := b.dynrunnerArgs(c, facades)
	if err != nil {
		return err
	}
	_, err = docker(ctx, b.runArgs(c, args...)...)
	return err
}

// podWorkerTemplate creates (never starts) a pod-worker container called name, configured as
// the bed's pod workers are, with env added, and returns its name at the engine: the template
// of AUTOSCALE=docker. Its copies carry its labels, so Close removes them too.
func (b *Bed) podWorkerTemplate(ctx context.Context, name string, env ...string) (string, error) {
	c := &Container{Name: name, Role: RolePodWorker, docker: b.dockerName(name), bed: b}
	args, err := b.dynrunnerArgs(c, strings.Join(b.FacadeURLs(), ","))
	if err != nil {
		return "", err
	}
	for _, e := range env {
		args = append(args[:len(args)-1], "-e", e, args[len(args)-1])
	}
	create := append([]string{"create", "--name", c.docker, "--network", b.Network, "--tmpfs", "/tmp:rw,mode=1777"}, append(labels(b.ID), args...)...)
	if _, err := docker(ctx, create...); err != nil {
		return "", err
	}
	return c.docker, nil
}

// dynrunnerArgs are the docker run flags and image of dynrunner container c.
func (b *Bed) dynrunnerArgs(c *Container, facades string) ([]string, error) {
	state := filepath.Join(b.opts.Dir, "state", c.Name)
	if c.Role == RolePodWorker {
		state = b.PodStateDir
	}
	if err := os.MkdirAll(state, 0o700); err != nil {
		return nil, err
	}
	env := []string{
		"COMPONENTS=" + c.Role,
		"HOME=/tmp",
		"STATE_DIR=" + state,
		"LOG_LEVEL=debug",
		"NATS_URL=" + b.NATSURL(),
		"NATS_USER=" + natsUser,
		"NATS_PASSWORD_FILE=/secrets/nats-password",
		"NATS_REPLICAS=3",
		"TASK_ENCRYPTION_KEY_FILE=/secrets/task.key",
		"RUNNER_FACADE_CAPABILITY_KEY_FILE=/secrets/capability.key",
		"GITEA_URL=" + b.Forge.URL(),
		"GITEA_RUNNER_UUID_FILE=/secrets/runner-uuid",
		"GITEA_RUNNER_TOKEN_FILE=/secrets/runner-token",
		"GITEA_RUNNER_SHA256=" + b.opts.Tools.RunnerSHA256,
		"GITEA_RUNNER_VERSION=" + b.opts.Tools.RunnerVersion,
		fmt.Sprintf("HTTP_LISTEN=0.0.0.0:%d", httpPort),
		fmt.Sprintf("RUNNER_FACADE_LISTEN=0.0.0.0:%d", facadePort),
		"RUNNER_FACADE_URL=" + facades,
		// The schedulers' capacity is the fleet's: every pod worker's slots.
		fmt.Sprintf("POD_CONCURRENCY=%d", b.opts.PodConcurrency*max(1, b.opts.PodWorkers)),
		"FETCH_INTERVAL=300ms",
	}
	args := []string{
		"-v", b.secrets + ":/secrets:ro",
		"-v", filepath.Join(b.opts.Dir, "ca") + ":" + filepath.Join(state, "ca") + ":ro",
		"-v", state + ":" + state,
	}
	if c.Role == RolePodWorker {
		env = append(env,
			"POD_BACKEND=docker",
			"POD_EXECUTOR_IMAGE="+b.opts.ExecutorImage,
			"POD_DOCKER_NETWORK="+b.Network,
			"POD_DOCKER_SCOPE="+b.Scope,
			fmt.Sprintf("POD_CONCURRENCY=%d", b.opts.PodConcurrency),
		)
		args = append(args, "-v", "/var/run/docker.sock:/var/run/docker.sock")
	}
	env = append(env, b.opts.Env...)
	if c.Role == RoleScheduler {
		env = append(env, b.opts.SchedulerEnv...)
		if b.opts.SchedulerDocker {
			args = append(args, "-v", "/var/run/docker.sock:/var/run/docker.sock")
		}
	}
	for _, e := range env {
		args = append(args, "-e", e)
	}
	return append(args, b.Images.Dynrunner), nil
}

// scopeOf is the POD_DOCKER_SCOPE of bed id's pod workers (1 to 32 lowercase letters and digits).
func scopeOf(id string) string { return "fleetbed" + id }

func (b *Bed) dockerName(name string) string { return "fleetbed-" + b.ID + "-" + name }

// runArgs is `docker run` of c on the bed's network with its name as host name and alias.
func (b *Bed) runArgs(c *Container, rest ...string) []string {
	return append([]string{"run", "-d", "--name", c.docker, "--hostname", c.Name,
		"--network", b.Network, "--network-alias", c.Name, "--tmpfs", "/tmp:rw,mode=1777"}, append(labels(b.ID), rest...)...)
}

// Container returns the bed's container called name, or nil.
func (b *Bed) Container(name string) *Container {
	for _, c := range append(append([]*Container{}, b.NATS...), b.Dynrunner...) {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// Role returns the bed's containers of role.
func (b *Bed) Role(role string) []*Container {
	var out []*Container
	for _, c := range append(append([]*Container{}, b.NATS...), b.Dynrunner...) {
		if c.Role == role {
			out = append(out, c)
		}
	}
	return out
}

// Addr is the container's current address on the bed's network.
func (c *Container) Addr(ctx context.Context) (netip.Addr, error) {
	ip, err := docker(ctx, "inspect", "-f", `{{with index .NetworkSettings.Networks "`+c.bed.Network+`"}}{{.IPAddress}}{{end}}`, c.docker)
	if err != nil {
		return netip.Addr{}, err
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("fleetbed: %s has no address on %s", c.Name, c.bed.Network)
	}
	return a, nil
}

// Kill is `docker kill`: SIGKILL, no clean shutdown.
func (c *Container) Kill(ctx context.Context) error {
	_, err := docker(ctx, "kill", c.docker)
	return err
}

// Start starts a stopped (killed) container again.
func (c *Container) Start(ctx context.Context) error {
	_, err := docker(ctx, "start", c.docker)
	return err
}

// Restart is `docker restart`: SIGTERM, a grace period, then start.
func (c *Container) Restart(ctx context.Context) error {
	_, err := docker(ctx, "restart", "-t", "30", c.docker)
	return err
}

// Disconnect cuts the container off the bed's network (a partition); Connect joins it again
// under its alias.
func (c *Container) Disconnect(ctx context.Context) error {
	_, err := docker(ctx, "network", "disconnect", c.bed.Network, c.docker)
	return err
}

// Connect joins the container to the bed's network again under its alias.
func (c *Container) Connect(ctx context.Context) error {
	_, err := docker(ctx, "network", "connect", "--alias", c.Name, c.bed.Network, c.docker)
	return err
}

// Logs returns the container's output (stdout and stderr).
func (c *Container) Logs(ctx context.Context) string {
	cmd := []string{"logs", c.docker}
	out, err := dockerCombined(ctx, cmd...)
	if err != nil {
		return err.Error()
	}
	return out
}

// WaitReady polls a dynrunner container's /readyz until it answers 200, for at most limit.
func (c *Container) WaitReady(ctx context.Context, limit time.Duration) error {
	return c.waitHTTP(ctx, httpPort, "/readyz", limit)
}

// HTTPURL is the base URL of a dynrunner container's HTTP endpoints from the host.
func (c *Container) HTTPURL(ctx context.Context) (string, error) {
	ip, err := c.Addr(ctx)
	if err != nil {
		return "", err
	}
	return "http://" + net.JoinHostPort(ip.String(), fmt.Sprint(httpPort)), nil
}

func (c *Container) waitHTTP(ctx context.Context, port int, path string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	hc := &http.Client{Timeout: 2 * time.Second}
	defer hc.CloseIdleConnections()
	var last error
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if running, err := docker(ctx, "inspect", "-f", "{{.State.Running}}", c.docker); err == nil && running != "true" {
			return fmt.Errorf("fleetbed: %s exited:\n%s", c.Name, Tail(c.Logs(ctx), 40))
		}
		ip, err := c.Addr(ctx)
		if err == nil {
			var resp *http.Response
			resp, err = hc.Get("http://" + net.JoinHostPort(ip.String(), fmt.Sprint(port)) + path)
			if err == nil {
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
				err = fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body))) // /readyz names what it waits for
			}
		}
		last = err
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("fleetbed: %s not ready at %s after %s: %w\n%s", c.Name, path, limit, last, Tail(c.Logs(ctx), 40))
}

// WaitRecovered waits, for at most limit, until every container of the bed runs and is ready
// (NATS nodes healthy, dynrunner processes ready) and progressed reports true. It logs how long
// each of the three took from its call.
func (b *Bed) WaitRecovered(ctx context.Context, limit time.Duration, progressed func() bool) error {
	began := time.Now()
	deadline := began.Add(limit)
	for _, c := range b.NATS {
		if err := c.waitHTTP(ctx, natsMonitorPort, "/healthz", time.Until(deadline)); err != nil {
			return err
		}
	}
	natsHealthy := time.Since(began)
	for _, c := range b.Dynrunner {
		if err := c.WaitReady(ctx, time.Until(deadline)); err != nil {
			return err
		}
	}
	ready := time.Since(began)
	for !progressed() {
		if time.Now().After(deadline) {
			return fmt.Errorf("fleetbed: every container ready (NATS nodes healthy after %s, dynrunner containers ready after %s), but no progress within %s",
				natsHealthy.Round(100*time.Millisecond), ready.Round(100*time.Millisecond), limit)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(250 * time.Millisecond)
	}
	b.logf("recovering: NATS nodes healthy after %s, dynrunner containers ready after %s, progress after %s",
		natsHealthy.Round(100*time.Millisecond), ready.Round(100*time.Millisecond), time.Since(began).Round(100*time.Millisecond))
	return nil
}

// JobContainers lists the names of the pod workers' job containers (the bed's scope), as an
// operator would with `docker ps`.
func (b *Bed) JobContainers(ctx context.Context) ([]string, error) {
	out, err := docker(ctx, "ps", "-a", "--format", "{{.Names}}", "--filter", "label=dynrunner.scope="+b.Scope)
	if err != nil {
		return nil, err
	}
	return strings.Fields(out), nil
}

// EnvironmentKeys lists the environment keys left in the workers' liveness bucket (each
// names the worker watching a live environment).
func (b *Bed) EnvironmentKeys(ctx context.Context) ([]string, error) {
	url, err := b.NATSHostURL(ctx)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, nats.UserInfo(natsUser, b.natsPass))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, eventlog.BucketWorkers)
	if err != nil {
		return nil, err
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for k := range keys.Keys() {
		if strings.HasPrefix(k, "env.") {
			out = append(out, "environment key "+k)
		}
	}
	return out, nil
}
