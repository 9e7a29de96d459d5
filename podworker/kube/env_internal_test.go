package kube

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

// TestPodEnvParses: executor.ParseEnv reads the Pod's environment, built from the variables a
// pod worker gives (podworkertest.WorkerEnv), back as the worker's configuration with the
// Pod's own directories and, with the SPIFFE CSI driver, the socket it mounts. The Pod is
// built only, for no cluster.
func TestPodEnvParses(t *testing.T) {
	for _, tc := range []struct {
		name       string
		csi        bool
		controller string
		want       string
	}{
		{"spiffe csi", true, "unix:///run/spire/agent.sock", SpiffeEndpointSocket},
		{"svid files", false, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(Config{
				Client:    kubernetes.NewForConfigOrDie(&rest.Config{Host: "http://127.0.0.1:1"}),
				Namespace: "dynrunner", Image: "executor@sha256:" + strings.Repeat("ab", 32), SpiffeCSI: tc.csi,
			})
			require.NoError(t, err)
			want := podworkertest.ExecutorConfig(7, 9)
			want.SpiffeEndpointSocket = tc.controller
			p := b.pod(podworker.Spec{Task: 7, Epoch: 9, Env: podworkertest.WorkerEnv(want)})
			require.Len(t, p.Spec.Containers, 1)
			env := map[string]string{}
			for _, v := range p.Spec.Containers[0].Env {
				require.NotContains(t, env, v.Name, "%s set twice", v.Name)
				require.Nil(t, v.ValueFrom, v.Name)
				env[v.Name] = v.Value
			}
			got, err := executor.ParseEnv(func(k string) string { return env[k] })
			require.NoError(t, err)
			want.SecretsDir, want.WorkDir, want.SpiffeEndpointSocket = SecretsDir, WorkDir, tc.want
			assert.Equal(t, want, got)
		})
	}
}
