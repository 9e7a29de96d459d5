package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker"
)

// envSpec is what a no-op environment receives from the pod worker: its assignment and its
// secret files (capability token, SVID, bundle).
type envSpec struct {
	Task  assignment.TaskID `json:"task"`
	Epoch assignment.Epoch  `json:"epoch"`
	Files map[string][]byte `json:"files"`
}

// facadeTarget is where environments find the facade and which SPIFFE ID it must present.
type facadeTarget struct {
	URL string
	TD  spiffeid.TrustDomain
}

// staticSource is an environment's SVID and bundle, read once from its files: the executor's
// workload.FromFiles without the polling, which a one-shot benchmark environment never needs.
type staticSource struct {
	svid   *x509svid.SVID
	bundle *x509bundle.Bundle
}

var _ workload.Source = staticSource{}

func (s staticSource) GetX509SVID() (*x509svid.SVID, error) { return s.svid, nil }

func (s staticSource) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return s.bundle.GetX509BundleForTrustDomain(td)
}

func (s staticSource) Close() error { return nil }

// envMode says how far a no-op environment goes.
type envMode int

const (
	// envFinish runs the job to its end: one log row and a final success, then exits.
	envFinish envMode = iota + 1
	// envHold stops after fetching the task and holds its connection until ctx ends, as a job
	// that is still running does.
	envHold
)

// runEnv does what an environment's executor and Gitea runner do at the facade, with a real
// connect client over mTLS and no job: Register with the capability token, FetchTask, and in
// envFinish mode one UpdateLog and a final UpdateTask(success). fetched, if not nil, is called
// once the task is in hand.
func runEnv(ctx context.Context, target facadeTarget, spec envSpec, mode envMode, fetched func()) error {
	svid, err := x509svid.Parse(spec.Files[workload.SVIDFile], spec.Files[workload.SVIDKeyFile])
	if err != nil {
		return fmt.Errorf("env %d: svid: %w", spec.Task, err)
	}
	bundle, err := x509bundle.Parse(target.TD, spec.Files[workload.BundleFile])
	if err != nil {
		return fmt.Errorf("env %d: bundle: %w", spec.Task, err)
	}
	// One transport per environment, as each environment is its own machine: every lifecycle
	// pays its own mTLS handshake.
	transport := &http.Transport{
		TLSClientConfig:   workload.ClientTLSConfig(staticSource{svid, bundle}, workload.FacadeID(target.TD)),
		ForceAttemptHTTP2: true,
	}
	defer transport.CloseIdleConnections()
	hc := &http.Client{Transport: transport, Timeout: time.Minute}

	reg, err := newRunnerClient(hc, target.URL, "", "").Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{
		Name: fmt.Sprintf("dynrunner-%d-%d", spec.Task, spec.Epoch), Token: string(spec.Files[podworker.TokenFile]),
		Version: "bench", Labels: []string{"self-hosted", "pod"}, Ephemeral: true,
	}))
	if err != nil {
		return fmt.Errorf("env %d: register: %w", spec.Task, err)
	}
	rc := newRunnerClient(hc, target.URL, reg.Msg.GetRunner().GetUuid(), reg.Msg.GetRunner().GetToken())
	got, err := rc.FetchTask(ctx, connect.NewRequest(&runnerv1.FetchTaskRequest{}))
	if err != nil {
		return fmt.Errorf("env %d: fetch: %w", spec.Task, err)
	}
	if got.Msg.GetTask().GetId() != int64(spec.Task) {
		return fmt.Errorf("env %d: fetched task %d", spec.Task, got.Msg.GetTask().GetId())
	}
	if fetched != nil {
		fetched()
	}
	if mode == envHold {
		<-ctx.Done()
		return nil
	}
	now := timestamppb.Now()
	if _, err := rc.UpdateLog(ctx, connect.NewRequest(&runnerv1.UpdateLogRequest{
		TaskId: int64(spec.Task), Rows: []*runnerv1.LogRow{{Time: now, Content: "hi"}}, NoMore: true,
	})); err != nil {
		return fmt.Errorf("env %d: update log: %w", spec.Task, err)
	}
	if _, err := rc.UpdateTask(ctx, connect.NewRequest(&runnerv1.UpdateTaskRequest{State: &runnerv1.TaskState{
		Id: int64(spec.Task), Result: runnerv1.Result_RESULT_SUCCESS, StartedAt: now, StoppedAt: timestamppb.Now(),
	}})); err != nil {
		return fmt.Errorf("env %d: update task: %w", spec.Task, err)
	}
	return nil
}

// newRunnerClient is the Gitea runner's RunnerService client: the facade serves it under
// /api/actions and authenticates a registered runner by its uuid and token headers.
func newRunnerClient(hc *http.Client, url, uuid, token string) runnerv1connect.RunnerServiceClient {
	return runnerv1connect.NewRunnerServiceClient(hc, url+"/api/actions", connect.WithInterceptors(
		connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				if uuid != "" {
					req.Header().Set("x-runner-uuid", uuid)
					req.Header().Set("x-runner-token", token)
				}
				return next(ctx, req)
			}
		})))
}

// errCancelled tells a cancelled environment from a failed one.
func errCancelled(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || connect.CodeOf(err) == connect.CodeCanceled)
}
