package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/config"
)

// TestExecutorEnv: the pod worker's environments get the variables they got when the
// controller wrote them out by hand, with the same values.
func TestExecutorEnv(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lease  time.Duration
		socket string
	}{
		{"default lease, spire", 300 * time.Second, "unix:///run/spire/agent.sock"},
		{"odd lease, development ca", 301*time.Second + 500*time.Millisecond, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Controller{
				FacadeID: spiffeid.RequireFromString("spiffe://dynrunner.test/dynrunner/facade"), Lease: tc.lease,
				GiteaRunnerSHA256: strings.Repeat("ab", 32), GiteaRunnerVersion: "v1.0.8",
				SpiffeEndpointSocket: tc.socket, LogFormat: "json",
			}
			require.Equal(t, map[string]string{
				"DYNRUNNER_FACADE_URL":       "https://10.0.0.1:8443",
				"DYNRUNNER_FACADE_SPIFFE_ID": cfg.FacadeID.String(),
				"DYNRUNNER_RENEW_SECS":       fmt.Sprint(int(cfg.Lease.Seconds()) / 3),
				"DYNRUNNER_LABELS":           "self-hosted:host,pod:host",
				"GITEA_RUNNER_BIN":           "/opt/gitea-runner",
				"GITEA_RUNNER_SHA256":        cfg.GiteaRunnerSHA256,
				"GITEA_RUNNER_VERSION":       cfg.GiteaRunnerVersion,
				"SPIFFE_ENDPOINT_SOCKET":     cfg.SpiffeEndpointSocket,
				"LOG_FORMAT":                 cfg.LogFormat,
			}, executorEnv(cfg, "https://10.0.0.1:8443", "/opt/gitea-runner"))
		})
	}
}
