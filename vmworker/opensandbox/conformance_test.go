package opensandbox_test

import (
	"testing"
	"time"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/vmworker/opensandbox"
	"github.com/dynrunner/dynrunner/vmworker/vmworkertest"
)

var scripts = map[vmworkertest.Behavior]vmworkertest.Script{
	vmworkertest.RunForever:   vmworkertest.ScriptRun,
	vmworkertest.ExitByItself: vmworkertest.ScriptExit,
	vmworkertest.FailInside:   vmworkertest.ScriptFail,
	vmworkertest.NeverReady:   vmworkertest.ScriptNeverRunning,
}

func harness(f *fixture) vmworkertest.Harness {
	return vmworkertest.Harness{
		New: func(t *testing.T) podworker.Backend {
			return f.backend(t, func(c *opensandbox.Config) { c.StartTimeout = 500 * time.Millisecond })
		},
		Spec: func(t *testing.T, task assignment.TaskID, behavior vmworkertest.Behavior) podworker.Spec {
			script, ok := scripts[behavior]
			if !ok {
				t.Fatalf("no script for %v", behavior)
			}
			return podworker.Spec{Task: task, Env: map[string]string{vmworkertest.ScriptEnv: string(script)}}
		},
		Gone: func(t *testing.T, h podworker.Handle) bool {
			_, ok := f.srv.Sandbox(h.ID)
			return !ok
		},
		Received: func(t *testing.T) [][]byte {
			var out [][]byte
			for _, r := range f.srv.Requests() {
				out = append(out, r.Body, []byte(r.Path+"?"+r.RawQuery))
			}
			return out
		},
		Redeem: func(t *testing.T, h podworker.Handle) (string, error) {
			sb, ok := f.srv.Sandbox(h.ID)
			if !ok {
				t.Fatalf("sandbox %s is gone", h.ID)
			}
			if sb.Env[opensandbox.EnvInstanceID] != h.Data[opensandbox.DataInstanceID] {
				t.Errorf("sandbox env instance id %q, handle %q", sb.Env[opensandbox.EnvInstanceID], h.Data[opensandbox.DataInstanceID])
			}
			_, _, token, err := f.nonces.Redeem(sb.Env[opensandbox.EnvInstanceID], sb.Env[opensandbox.EnvNonce])
			return token, err
		},
		Timeout: 10 * time.Second,
	}
}

func TestConformance(t *testing.T) {
	vmworkertest.RunConformance(t, harness(newFixture(t, vmworkertest.ServerConfig{})))
}

// TestConformanceSlowServer runs the suite against a server that provisions slowly and keeps
// deleted sandboxes Stopping, then Terminated, for a while, as a Kubernetes-backed one does.
func TestConformanceSlowServer(t *testing.T) {
	vmworkertest.RunConformance(t, harness(newFixture(t, vmworkertest.ServerConfig{
		ProvisionDelay: 30 * time.Millisecond,
		DeleteLinger:   100 * time.Millisecond,
		Pools:          []string{opensandbox.DefaultPool},
	})))
}
