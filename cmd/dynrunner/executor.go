package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/executor"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker"
)

// runExecutor is the entry point inside an environment. Its configuration comes from the
// environment the pod worker set (docs/configuration.md, "Executor").
func runExecutor(ctx context.Context, args []string) error {
	if len(args) > 0 {
		return errors.New("executor takes no arguments; the pod worker configures it through the environment")
	}
	format := os.Getenv("LOG_FORMAT")
	if format == "" {
		format = "json"
	}
	log, err := newLogger(os.Stderr, format, "info", "executor")
	if err != nil {
		return err
	}
	var errs []error
	need := func(name string) string {
		v := os.Getenv(name)
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is not set", name))
		}
		return v
	}
	facadeURL := need("DYNRUNNER_FACADE_URL")
	facadeIDs := need("DYNRUNNER_FACADE_SPIFFE_ID")
	taskS, epochS := need("DYNRUNNER_TASK_ID"), need("DYNRUNNER_EPOCH")
	secrets, work := need("DYNRUNNER_SECRETS_DIR"), need("DYNRUNNER_WORK_DIR")
	bin, sha := need("GITEA_RUNNER_BIN"), need("GITEA_RUNNER_SHA256")
	if len(errs) > 0 {
		return fmt.Errorf("executor configuration: %w", errors.Join(errs...))
	}
	facadeID, err := spiffeid.FromString(facadeIDs)
	if err != nil {
		return fmt.Errorf("DYNRUNNER_FACADE_SPIFFE_ID: %w", err)
	}
	task, err := assignment.ParseTaskID(taskS)
	if err != nil {
		return err
	}
	epoch, err := assignment.ParseEpoch(epochS)
	if err != nil {
		return err
	}
	renew := 100 * time.Second
	if v := os.Getenv("DYNRUNNER_RENEW_SECS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("DYNRUNNER_RENEW_SECS=%q: want a positive integer", v)
		}
		renew = time.Duration(n) * time.Second
	}
	var forge assignment.ForgeURL
	if v := os.Getenv("DYNRUNNER_FORGE_URL"); v != "" {
		if forge, err = assignment.ParseForgeURL(v); err != nil {
			return fmt.Errorf("DYNRUNNER_FORGE_URL: %w", err)
		}
	}
	labels := strings.Split(os.Getenv("DYNRUNNER_LABELS"), ",")
	if os.Getenv("DYNRUNNER_LABELS") == "" {
		labels = []string{"self-hosted:host", "pod:host"}
	}
	token, err := secretfile.Read(filepath.Join(secrets, podworker.TokenFile))
	if err != nil {
		return fmt.Errorf("capability token: %w", err)
	}
	log = log.With().Int64("task_id", int64(task)).Uint64("epoch", uint64(epoch)).Logger()

	// Wait for the environment's own SVID before anything else.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var src workload.Source
	if sock := os.Getenv("SPIFFE_ENDPOINT_SOCKET"); sock != "" {
		src, err = workload.FromWorkloadAPIFor(wctx, sock, workload.AssignmentID(facadeID.TrustDomain(), task, epoch))
	} else {
		src, err = workload.FromFiles(wctx, secrets, 200*time.Millisecond)
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

	return executor.Run(ctx, executor.Config{
		FacadeURL: facadeURL, FacadeID: facadeID, Task: task, Epoch: epoch, Token: string(token), TLS: workload.ClientTLSConfig(src, facadeID),
		RunnerBin: bin, RunnerSHA256: sha, RunnerVersion: os.Getenv("GITEA_RUNNER_VERSION"),
		Labels: labels, WorkDir: work, Renew: renew, ForgeURL: forge, Output: os.Stdout, Log: log,
	})
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
