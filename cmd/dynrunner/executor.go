package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker"
)

// runExecutor is the entry point inside an environment. Its configuration comes from the
// environment the pod worker set (docs/configuration.md, "Executor").
func runExecutor(ctx context.Context, args []string, getenv func(string) string) error {
	if len(args) > 0 {
		return errors.New("executor takes no arguments; the pod worker configures it through the environment")
	}
	if executor.IsGitHub(getenv) {
		return runGitHubExecutor(ctx, getenv)
	}
	cfg, err := executor.ParseEnv(getenv)
	if err != nil {
		return err
	}
	log, err := newLogger(os.Stderr, cfg.LogFormat, "info", "executor")
	if err != nil {
		return err
	}
	task, epoch, facadeID := cfg.Task, cfg.Epoch, cfg.FacadeID
	token, err := secretfile.Read(filepath.Join(cfg.SecretsDir, podworker.TokenFile))
	if err != nil {
		return fmt.Errorf("capability token: %w", err)
	}
	log = log.With().Int64("task_id", int64(task)).Uint64("epoch", uint64(epoch)).Logger()

	// Wait for the environment's own SVID before anything else.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var src workload.Source
	if cfg.SpiffeEndpointSocket != "" {
		src, err = workload.FromWorkloadAPIFor(wctx, cfg.SpiffeEndpointSocket, workload.AssignmentID(facadeID.TrustDomain(), task, epoch))
	} else {
		src, err = workload.FromFiles(wctx, cfg.SecretsDir, 200*time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("wait for the SVID: %w", err)
	}
	defer src.Close()
	svid, err := waitOwnSVID(wctx, src, facadeID.TrustDomain(), task, epoch)
	if err != nil {
		return err
	}
	log.Info().Str("spiffe_id", svid.ID.String()).Msg("SVID received")

	return executor.Run(ctx, executor.RunConfig{
		Config: cfg, Token: string(token), TLS: workload.ClientTLSConfig(src, facadeID), Env: os.Environ(), Output: os.Stdout, Log: log,
	})
}

// runGitHubExecutor runs a GitHub slot's environment: GitHub's runner with the slot's JIT
// configuration, and nothing of the facade path.
func runGitHubExecutor(ctx context.Context, getenv func(string) string) error {
	cfg, err := executor.ParseGitHubEnv(getenv)
	if err != nil {
		return err
	}
	log, err := newLogger(os.Stderr, cfg.LogFormat, "info", "executor")
	if err != nil {
		return err
	}
	log = log.With().Int64("task_id", int64(cfg.Task)).Uint64("epoch", uint64(cfg.Epoch)).Logger()
	return executor.RunGitHub(ctx, executor.GitHubRunConfig{GitHubConfig: cfg, Env: os.Environ(), Output: os.Stdout, Log: log})
}

// waitOwnSVID waits until src holds the SVID of the assignment (task, epoch) and returns it. A
// Workload API may first serve another identity (an entry of the environment's node or Pod
// that its registrar is still replacing); the executor keeps waiting for its own until ctx
// ends, and then names the identity it had.
func waitOwnSVID(ctx context.Context, src workload.Source, td spiffeid.TrustDomain, task assignment.TaskID, epoch assignment.Epoch) (*x509svid.SVID, error) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		svid, err := src.GetX509SVID()
		if err == nil {
			if t, e, perr := workload.ParseAssignmentID(svid.ID, td); perr == nil && t == task && e == epoch {
				return svid, nil
			}
			err = fmt.Errorf("the SVID %s is not the identity of task %d epoch %d", svid.ID, task, epoch)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for the SVID of task %d epoch %d: %w", task, epoch, err)
		case <-tick.C:
		}
	}
}
