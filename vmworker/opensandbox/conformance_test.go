package opensandbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox/opensandboxtest"
)

var scripts = map[podworkertest.Behavior]opensandboxtest.Script{
	podworkertest.RunForever:  opensandboxtest.ScriptRun,
	podworkertest.ExitZero:    opensandboxtest.ScriptExit,
	podworkertest.ExitNonZero: opensandboxtest.ScriptFail,
	podworkertest.NeverReady:  opensandboxtest.ScriptNeverRunning,
}

// withoutFiles is why the checks of the executor's files do not apply: a sandbox receives no
// file of the spec, only the nonce it redeems for the capability token.
const withoutFiles = "spec.Files never leave the controller: the sandbox gets a single-use nonce for the capability token (see TokenOnlyThroughNonce)"

func harness(f *fixture) podworkertest.Harness {
	return podworkertest.Harness{
		New: func(t *testing.T) podworker.Backend {
			return f.backend(t, func(c *opensandbox.Config) { c.StartTimeout = 500 * time.Millisecond })
		},
		Spec: func(t *testing.T, task assignment.TaskID, behavior podworkertest.Behavior) podworker.Spec {
			script, ok := scripts[behavior]
			require.True(t, ok, "no script for %v", behavior)
			return podworker.Spec{Task: task, Env: map[string]string{opensandboxtest.ScriptEnv: string(script)}}
		},
		Gone: func(t *testing.T, h podworker.Handle) bool {
			_, ok := f.srv.Sandbox(h.ID)
			return !ok
		},
		// The server deletes a sandbox asynchronously (Stopping, then Terminated).
		ListLags: true,
		Nonce: &podworkertest.NonceHarness{
			Received: func(t *testing.T) [][]byte {
				var out [][]byte
				for _, r := range f.srv.Requests() {
					out = append(out, r.Body, []byte(r.Path+"?"+r.RawQuery))
				}
				return out
			},
			Redeem: func(t *testing.T, h podworker.Handle) (string, error) {
				sb, ok := f.srv.Sandbox(h.ID)
				require.True(t, ok, "sandbox %s is gone", h.ID)
				assert.Equal(t, h.Data[opensandbox.DataInstanceID], sb.Env[opensandbox.EnvInstanceID], "the sandbox's instance id, against the handle's")
				_, _, cred, err := f.redeem(t, sb.Env[opensandbox.EnvInstanceID], sb.Env[opensandbox.EnvNonce])
				return cred.Token, err
			},
		},
		Without: map[string]string{
			podworkertest.CheckSecretFiles:             withoutFiles,
			podworkertest.CheckRejectsUnsafeSecretName: withoutFiles,
			podworkertest.CheckWriteFiles:              "the sandbox's file system is the server's; the fake server runs no process that could write",
			podworkertest.CheckDiagnose:                "the Lifecycle API serves no sandbox logs; Wait's reason carries the server's status message",
		},
		Timeout: 10 * time.Second,
	}
}

func TestConformance(t *testing.T) {
	podworkertest.RunConformance(t, harness(newFixture(t, opensandboxtest.ServerConfig{})))
}

// TestConformanceSlowServer runs the suite against a server that provisions slowly and keeps
// deleted sandboxes Stopping, then Terminated, for a while, as a Kubernetes-backed one does.
func TestConformanceSlowServer(t *testing.T) {
	podworkertest.RunConformance(t, harness(newFixture(t, opensandboxtest.ServerConfig{
		ProvisionDelay: 30 * time.Millisecond,
		DeleteLinger:   100 * time.Millisecond,
		Pools:          []string{opensandbox.DefaultPool},
	})))
}
