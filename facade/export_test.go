package facade

import "github.com/dynrunner/dynrunner/internal/assignment"

// RunnerToken is the runner credential a facade with runnerKey hands the runner uuid of task's
// assignment in epoch at Register, for tests that present the credentials of another epoch.
func RunnerToken(runnerKey []byte, task assignment.TaskID, epoch assignment.Epoch, uuid string) string {
	f := &Facade{cfg: Config{RunnerKey: runnerKey}}
	return f.runnerToken(caller{task: task, epoch: epoch}, uuid)
}
