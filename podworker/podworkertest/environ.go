package podworkertest

import (
	"maps"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
)

// ExecutorConfig is an executor configuration with every field the controller and the pod
// worker set, for the environment of task and epoch: all but the backend's SecretsDir,
// WorkDir and SpiffeEndpointSocket, which a backend's test sets to what its environments see
// before it compares with what executor.ParseEnv reads back.
func ExecutorConfig(task assignment.TaskID, epoch assignment.Epoch) executor.Config {
	return executor.Config{
		FacadeURL: "https://127.0.0.1:8443,https://127.0.0.2:8443",
		FacadeID:  spiffeid.RequireFromString("spiffe://dynrunner.test/dynrunner/facade"),
		Task:      task, Epoch: epoch, ForgeURL: "https://gitea.example.com",
		Labels: executor.Labels(assignment.BackendPod), Renew: 100 * time.Second,
		RunnerBin: "/opt/gitea-runner", RunnerSHA256: strings.Repeat("ab", 32), RunnerVersion: "v1.0.8",
		SpiffeEndpointSocket: "unix:///run/spire/agent.sock", LogFormat: "console",
	}
}

// WorkerEnv is the variables a pod worker gives a backend for the environment of c (its
// podworker.Spec.Env): the controller's (executor.Config.Environ, without the assignment's and
// the backend's parts) and the assignment's (executor.Config.AssignmentEnv).
func WorkerEnv(c executor.Config) map[string]string {
	controller := c
	controller.Task, controller.Epoch, controller.ForgeURL = 0, 0, ""
	controller.SecretsDir, controller.WorkDir = "", ""
	env := controller.Environ()
	maps.Copy(env, c.AssignmentEnv())
	return env
}
