package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/docker"
	"github.com/dynrunner/dynrunner/podworker/kube"
	"github.com/dynrunner/dynrunner/podworker/local"
)

// podTier is the pod worker's backend and what its environments are given.
type podTier struct {
	backend podworker.Backend
	// runnerBin is the path of the Gitea runner as the environments see it (GITEA_RUNNER_BIN
	// of the executor).
	runnerBin string
	// facadeURL is where the environments reach the facade (DYNRUNNER_FACADE_URL).
	facadeURL string
	// jobNet is the docker backend's network; zero for the other backends.
	jobNet jobNetwork
}

// newPodTier builds the pod worker's backend from POD_BACKEND. onPhase receives the Pod
// phases of the kubernetes backend. Warnings about what jobs can reach go to warns.
func newPodTier(ctx context.Context, cfg config.Controller, exe string, log zerolog.Logger, warns *bootWarnings,
	onPhase func(context.Context, podworker.Handle, kube.PhaseChange)) (podTier, error) {
	var (
		t   = podTier{facadeURL: cfg.FacadeURL}
		err error
	)
	switch cfg.PodBackend {
	case "kubernetes":
		t.backend, t.runnerBin, err = kubeBackend(ctx, cfg, log, warns, onPhase)
	case "docker":
		var b *docker.Backend
		if b, err = dockerBackend(ctx, cfg, log, warns); err != nil {
			return t, err
		}
		t.backend, t.runnerBin = b, docker.RunnerBin
		if t.jobNet, err = prepareJobNetwork(ctx, cfg, b, log, warns); err != nil {
			return t, err
		}
		t.facadeURL = t.jobNet.FacadeURL
		log.Info().Str("network", t.jobNet.Name).Bool("isolated", t.jobNet.Managed).Str("facade_url", t.facadeURL).Msg("job network ready")
	default:
		t.backend, t.runnerBin, err = localBackend(cfg, exe, log, warns)
	}
	return t, err
}

// dockerBackend builds the docker pod backend and checks the engine and the executor image.
func dockerBackend(ctx context.Context, cfg config.Controller, log zerolog.Logger, warns *bootWarnings) (*docker.Backend, error) {
	d := cfg.Docker
	b, err := docker.New(docker.Config{
		Socket: d.Socket, Image: d.Image, RunnerSHA256: cfg.GiteaRunnerSHA256, Network: d.Network,
		Memory: int64(d.MemoryMiB) << 20, CPUs: d.CPUs, Pids: int64(d.Pids),
		Privileged: d.Privileged, User: d.User, Scope: d.Scope,
		StateDir:     filepath.Join(cfg.StateDir, "docker-envs"),
		SpiffeSocket: cfg.SpiffeEndpointSocket, // empty with the development CA
		Log:          log,
	})
	if err != nil {
		return nil, err
	}
	if err := b.Check(ctx); errors.Is(err, docker.ErrRunnerMismatch) {
		return nil, fmt.Errorf("POD_BACKEND=docker: POD_EXECUTOR_IMAGE and GITEA_RUNNER_SHA256 disagree: %w", err)
	} else if err != nil {
		return nil, fmt.Errorf("POD_BACKEND=docker: %w", err)
	}
	if d.Privileged {
		warns.warn(log, "POD_DOCKER_PRIVILEGED=true: job containers run privileged, as root, with every capability and device; a job can take over this host")
	}
	log.Info().Str("image", d.Image).Str("network", d.Network).Int("memory_mib", d.MemoryMiB).
		Float64("cpus", d.CPUs).Int("pids", d.Pids).Str("spiffe_socket", cfg.SpiffeEndpointSocket).Msg("docker pod backend ready")
	return b, nil
}

// localBackend builds the local pod backend. A root controller runs each environment under a
// uid of its own; any other says loudly that jobs run as its user.
func localBackend(cfg config.Controller, exe string, log zerolog.Logger, warns *bootWarnings) (podworker.Backend, string, error) {
	users, warning := localUsers(cfg, os.Geteuid())
	if users != nil {
		if err := local.OpenStateDir(cfg.StateDir, log); err != nil {
			return nil, "", fmt.Errorf("POD_BACKEND=local: STATE_DIR: %w", err)
		}
	} else {
		warns.warn(log, warning)
	}
	// PATH is passed through to environments (docs/configuration.md, Executor variables), not
	// configuration: no parser reads it.
	b, err := local.New(local.Config{
		Root:     filepath.Join(cfg.StateDir, "envs"),
		Command:  []string{exe, "executor"},
		BaseEnv:  []string{"PATH=" + os.Getenv("PATH"), "LANG=C.UTF-8"},
		Users:    users,
		Programs: []string{cfg.GiteaRunnerBin},
		Log:      log,
	})
	if err != nil {
		return nil, "", fmt.Errorf("POD_BACKEND=local: %w", err)
	}
	if users != nil {
		log.Info().Uint32("uid_first", users.First).Uint32("uid_count", users.Count).
			Msg("local pod backend ready: each environment runs under a uid of its own")
	}
	return b, b.Program(cfg.GiteaRunnerBin), nil
}

// localUsers decides whose uid local environments run as: each its own from POD_LOCAL_UID_*
// when the controller is root (euid 0), else the controller's, with the warning that says so.
func localUsers(cfg config.Controller, euid int) (*local.Users, string) {
	if euid == 0 {
		return &local.Users{First: cfg.Local.UIDBase, Count: cfg.Local.UIDCount}, ""
	}
	return nil, fmt.Sprintf("POD_BACKEND=local and the controller is not root: every job runs as the controller's user (uid %d) "+
		"and can read its secrets: the keys and NATS password in STATE_DIR, the resident runner's credentials, other jobs' secrets and, "+
		"through them, their tasks. Run the controller as root to give each job a uid of its own, or use the docker or kubernetes backend", euid)
}

// kubeRESTConfig returns the Kubernetes client configuration of the kubeconfig file, or the
// in-cluster one when kubeconfig is "".
func kubeRESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

// kubeBackend builds the kubernetes pod backend from KUBECONFIG (or the in-cluster
// configuration) and checks its permissions at boot.
func kubeBackend(ctx context.Context, cfg config.Controller, log zerolog.Logger, warns *bootWarnings,
	onPhase func(context.Context, podworker.Handle, kube.PhaseChange)) (podworker.Backend, string, error) {
	k := cfg.Kube
	rc, err := kubeRESTConfig(k.Kubeconfig)
	if err != nil {
		return nil, "", fmt.Errorf("POD_BACKEND=kubernetes: cluster configuration (KUBECONFIG, or in-cluster): %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", fmt.Errorf("POD_BACKEND=kubernetes: %w", err)
	}
	privileged := k.Privileged
	b, err := kube.New(kube.Config{
		Client: client, Namespace: k.Namespace, Image: k.Image,
		Resources:      kube.Resources{CPURequest: k.CPURequest, CPULimit: k.CPULimit, MemoryRequest: k.MemoryRequest, MemoryLimit: k.MemoryLimit},
		ActiveDeadline: k.ActiveDeadline, Grace: k.Grace, ServiceAccount: k.ServiceAccount, ImagePullSecrets: k.PullSecrets,
		SpiffeCSI: k.SpiffeCSI, Privileged: &privileged, OnPhase: onPhase, Log: log,
	})
	if err != nil {
		return nil, "", err
	}
	if err := b.Check(ctx); err != nil {
		return nil, "", fmt.Errorf("POD_BACKEND=kubernetes: %w", err)
	}
	if privileged {
		warns.warn(log, "POD_PRIVILEGED=true (the default): job Pods are privileged so workflows can set up Docker, BuildKit or kind; run them in a dedicated namespace on dedicated nodes")
	}
	log.Info().Str("namespace", k.Namespace).Str("image", k.Image).Bool("spiffe_csi", k.SpiffeCSI).Msg("kubernetes pod backend ready")
	return b, kube.RunnerBin, nil
}
