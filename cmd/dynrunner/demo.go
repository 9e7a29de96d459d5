package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/launcher"
)

// demoWorkflow is the sample workflow the demo pushes: one job in a one-shot pod environment.
const demoWorkflow = `name: demo
on: [push]
jobs:
  hello:
    runs-on: [self-hosted, pod]
    steps:
      - name: where am I
        run: |
          echo "hello from a one-shot dynrunner environment"
          echo "workdir: $PWD"
          uname -a
      - name: a secret stays masked
        run: echo "the demo secret is ${{ secrets.DEMO_SECRET }}"
      - name: outputs
        id: out
        run: echo "answer=42" >> "$GITHUB_OUTPUT"
      - run: echo "the answer is ${{ steps.out.outputs.answer }}"
` + demoCloneStep

// demoCloneStep clones the job's repository from the forge with the job's token, as
// actions/checkout does.
const demoCloneStep = `      - name: clone the repository
        env:
          TOKEN: ${{ gitea.token }}
        run: |
          auth=$(printf 'x-access-token:%s' "$TOKEN" | base64 -w0)
          git -c http.extraHeader="Authorization: Basic $auth" clone -q "${{ gitea.server_url }}/${{ gitea.repository }}" repo
          git -C repo log -1 --format='cloned ${{ gitea.repository }} at %h: %s'
          ls repo
`

// demoVMWorkflow is the sample workflow of `demo --vm`: one job in a one-shot microVM.
const demoVMWorkflow = `name: demo-vm
on: [push]
jobs:
  hello-vm:
    runs-on: [self-hosted, vm]
    steps:
      - name: where am I
        shell: sh
        run: |
          echo "hello from a one-shot dynrunner microVM"
          echo "kernel $(uname -r), $(nproc) vCPU"
          grep -m1 'model name' /proc/cpuinfo
          echo "$(. /etc/os-release; echo "$PRETTY_NAME"), node $(node --version), $(git --version)"
` + demoCloneStep

// demoOptions are the flags of `dynrunner demo`.
type demoOptions struct {
	once, keep, vm bool
}

// parseDemoFlags parses the flags of `dynrunner demo`.
func parseDemoFlags(args []string) (demoOptions, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	once := fs.Bool("once", false, "exit after the sample job instead of running until Ctrl-C")
	keep := fs.Bool("keep", false, "keep the demo's state directory")
	vm := fs.Bool("vm", false, "run the sample job in a microVM booted under QEMU (needs root and scripts/vm-deps.sh)")
	if err := fs.Parse(args); err != nil {
		return demoOptions{}, err
	}
	return demoOptions{once: *once, keep: *keep, vm: *vm}, nil
}

// runDemo starts a development Gitea and a controller on embedded defaults, pushes a sample
// workflow with a [self-hosted, pod] job, and prints its result and log.
func runDemo(ctx context.Context, args []string, getenv func(string) string) error {
	opts, err := parseDemoFlags(args)
	if err != nil {
		return err
	}
	out := zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly}
	log := zerolog.New(out).With().Timestamp().Str("component", "demo").Logger()

	tools, err := devforge.FindTools()
	if err != nil {
		return fmt.Errorf("%w\nbuild them with: go tool task tools", err)
	}
	dir, err := demoDir(getenv)
	if err != nil {
		return err
	}
	if !opts.keep {
		defer os.RemoveAll(dir)
	}
	forge, err := startDemoForge(ctx, tools, dir, opts.vm, log)
	if err != nil {
		return err
	}
	defer forge.Close()
	repo, regToken, err := prepareDemoRepo(ctx, forge)
	if err != nil {
		return err
	}
	state, temp, err := demoStateDir(dir, log)
	if err != nil {
		return err
	}
	if temp && !opts.keep {
		defer os.RemoveAll(state)
	}
	cfg, workflow, err := demoConfig(ctx, dir, state, forge.URL(), regToken, tools, opts.vm)
	if err != nil {
		return err
	}
	clog, err := newLogger(os.Stderr, "console", "info", "controller")
	if err != nil {
		return err
	}
	cctx, stopController := context.WithCancel(ctx)
	defer stopController()
	cerr := make(chan error, 1)
	go func() { cerr <- controller(cctx, cfg, clog) }()
	if err := waitReady(ctx, "http://"+cfg.HTTPListen+"/readyz", cerr); err != nil {
		return err
	}
	if err := runDemoWorkflow(ctx, forge, repo, workflow, log); err != nil {
		return err
	}
	if opts.once {
		stopController()
		return <-cerr
	}
	fmt.Printf("\nGitea: %s (user %s, token in %s)\nController: http://%s/metrics — push more workflows; Ctrl-C stops.\n",
		forge.URL(), devforge.AdminUser, filepath.Join(dir, "gitea"), cfg.HTTPListen)
	select {
	case <-ctx.Done():
		stopController()
		return <-cerr
	case err := <-cerr:
		return err
	}
}

// demoDir creates the demo's directory under DYNRUNNER_CACHE (default ~/.cache/dynrunner).
func demoDir(getenv func(string) string) (string, error) {
	cache := demoCache(getenv)
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(cache, "demo-")
}

// demoCache is the configuration of `dynrunner demo`: DYNRUNNER_CACHE, default
// ~/.cache/dynrunner.
func demoCache(getenv func(string) string) string {
	if cache := getenv("DYNRUNNER_CACHE"); cache != "" {
		return cache
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "dynrunner")
}

// startDemoForge starts the demo's Gitea in dir; with vm it listens on the microVM bridge.
func startDemoForge(ctx context.Context, tools devforge.Tools, dir string, vm bool, log zerolog.Logger) (*devforge.Forge, error) {
	forgeAddr := ""
	if vm {
		// Guests cannot reach the host's loopback: Gitea listens on the microVM bridge, which
		// the guests' firewall lets them reach (VM_EGRESS=nat).
		var err error
		if forgeAddr, err = demoBridge(ctx, dir); err != nil {
			return nil, err
		}
	}
	log.Info().Str("dir", dir).Msg("starting Gitea " + tools.GiteaVersion)
	return devforge.Start(ctx, tools, devforge.Options{Dir: filepath.Join(dir, "gitea"), Addr: forgeAddr, Logger: log})
}

// prepareDemoRepo creates the demo repository with its secret and returns it with a runner
// registration token.
func prepareDemoRepo(ctx context.Context, forge *devforge.Forge) (devforge.Repo, string, error) {
	repo, err := forge.CreateRepo(ctx, "demo")
	if err != nil {
		return repo, "", err
	}
	if err := forge.SetSecret(ctx, repo, "DEMO_SECRET", "correct-horse-battery-staple"); err != nil {
		return repo, "", err
	}
	regToken, err := forge.RunnerRegistrationToken(ctx, "")
	return repo, regToken, err
}

// demoStateDir is the controller's STATE_DIR: dir/controller, or as root a temporary directory
// of its own (temp), which the demo removes on its own.
func demoStateDir(dir string, log zerolog.Logger) (state string, temp bool, err error) {
	if os.Geteuid() != 0 {
		return filepath.Join(dir, "controller"), false, nil
	}
	// As root the local environments run under uids of their own, which must pass through
	// every directory above STATE_DIR; a home directory (/root) does not let them.
	if state, err = os.MkdirTemp("", "dynrunner-demo-controller-"); err != nil {
		return "", false, err
	}
	log.Info().Str("state_dir", state).Msg("controller state outside the demo directory: the jobs' uids must reach it")
	return state, true, nil
}

// demoConfig is the demo controller's configuration, on embedded defaults and free loopback
// ports, and the sample workflow it runs; with vm, the vm worker's too.
func demoConfig(ctx context.Context, dir, state, forgeURL, regToken string, tools devforge.Tools, vm bool) (config.Controller, string, error) {
	regFile := filepath.Join(dir, "registration-token")
	if err := secretfile.WriteNew(regFile, []byte(regToken)); err != nil {
		return config.Controller{}, "", err
	}
	ports, err := freePorts(3)
	if err != nil {
		return config.Controller{}, "", err
	}
	env := map[string]string{
		"STATE_DIR":                            state,
		"GITEA_URL":                            forgeURL,
		"GITEA_RUNNER_REGISTRATION_TOKEN_FILE": regFile,
		"GITEA_RUNNER_NAME":                    "dynrunner-demo",
		"GITEA_RUNNER_BIN":                     tools.RunnerBin,
		"GITEA_RUNNER_SHA256":                  tools.RunnerSHA256,
		"GITEA_RUNNER_VERSION":                 tools.RunnerVersion,
		"HTTP_LISTEN":                          fmt.Sprintf("127.0.0.1:%d", ports[0]),
		"RUNNER_FACADE_LISTEN":                 fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"NATS_EMBEDDED_LISTEN":                 fmt.Sprintf("127.0.0.1:%d", ports[2]),
		"LOG_FORMAT":                           "console",
	}
	workflow := demoWorkflow
	if vm {
		if err := demoVMEnv(ctx, dir, env); err != nil {
			return config.Controller{}, "", err
		}
		workflow = demoVMWorkflow
	}
	cfg, err := config.LoadController(func(k string) string { return env[k] })
	if err != nil {
		return cfg, "", fmt.Errorf("demo configuration: %w", err)
	}
	return cfg, workflow, nil
}

// runDemoWorkflow pushes workflow, waits for its run and prints its jobs' logs and conclusion.
func runDemoWorkflow(ctx context.Context, forge *devforge.Forge, repo devforge.Repo, workflow string, log zerolog.Logger) error {
	sha, err := forge.PushWorkflow(ctx, repo, ".gitea/workflows/demo.yml", workflow)
	if err != nil {
		return err
	}
	log.Info().Str("repo", forge.URL()+"/"+repo.String()).Msg("pushed the sample workflow; waiting for it")
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	run, err := forge.WaitRun(wctx, repo, sha)
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, j := range run.Jobs {
		logText, err := forge.JobLog(ctx, repo, j.ID)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "\n=== job %q: %s (runner %s)\n%s", j.Name, j.Conclusion, j.RunnerName, logText)
	}
	fmt.Println(b.String())
	fmt.Printf("run %d: %s\n", run.ID, run.Conclusion)
	if !run.Succeeded() {
		return fmt.Errorf("demo: the sample run concluded %s", run.Conclusion)
	}
	return nil
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func waitReady(ctx context.Context, url string, cerr <-chan error) error {
	deadline := time.NewTimer(2 * time.Minute)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-cerr:
			if err == nil {
				err = errors.New("controller stopped")
			}
			return err
		case <-deadline.C:
			return errors.New("demo: the controller was not ready within 2 minutes")
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if httpOK(ctx, url) {
				return nil
			}
		}
	}
}

// The demo's microVM bridge.
const demoBridgeName = "drdemo0"

var demoBridgeCIDR = netip.MustParsePrefix("10.213.99.1/24")

// demoBridge creates the demo's microVM bridge and returns its address, for Gitea to listen on.
func demoBridge(ctx context.Context, dir string) (string, error) {
	if os.Geteuid() != 0 {
		return "", errors.New("demo --vm needs root for the microVM bridge and TAP devices")
	}
	if err := launcher.EnsureBridge(ctx, filepath.Join(dir, "vms"), demoBridgeName, demoBridgeCIDR); err != nil {
		return "", err
	}
	return demoBridgeCIDR.Addr().String(), nil
}

// demoVMEnv builds the guest image operators deploy (deploy/vm-image/build.sh) around this
// (static) binary and points the controller's vm worker at it: QEMU with TCG, the demo's
// bridge, NAT egress to the forge only.
func demoVMEnv(ctx context.Context, dir string, env map[string]string) error {
	if os.Geteuid() != 0 {
		return errors.New("demo --vm needs root for the microVM bridge and TAP devices")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	script := filepath.Join("deploy", "vm-image", "build.sh")
	if _, err := os.Stat(script); err != nil {
		return fmt.Errorf("demo --vm runs from the repository root (it needs %s): %w", script, err)
	}
	img := filepath.Join(dir, "vm-image")
	cmd := exec.CommandContext(ctx, "bash", script, img)
	cmd.Env = append(os.Environ(), "DYNRUNNER_BIN="+exe)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("build the guest image (is the binary static? build it with CGO_ENABLED=0): %w", err)
	}
	cmdline, err := os.ReadFile(filepath.Join(img, "cmdline"))
	if err != nil {
		return err
	}
	for k, v := range map[string]string{
		"VM_IMAGE":         filepath.Join(img, "rootfs.qcow2"),
		"VM_KERNEL":        filepath.Join(img, "vmlinuz"),
		"VM_INITRAMFS":     filepath.Join(img, "initrd.img"),
		"VM_CMDLINE":       strings.TrimSpace(string(cmdline)),
		"VM_HYPERVISOR":    "qemu",
		"VM_CPUS":          "1",
		"VM_MEMORY_MIB":    "1024",
		"VM_DISK_GIB":      "2",
		"VM_BRIDGE":        demoBridgeName,
		"VM_BRIDGE_CIDR":   demoBridgeCIDR.String(),
		"VM_EGRESS":        "nat",
		"VM_LAUNCHER_ROOT": filepath.Join(dir, "vms"),
	} {
		env[k] = v
	}
	return nil
}
