package main

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestControllerRefusesUnsafeBoot runs the controller entry point with configurations that
// must not boot and checks the message tells the operator what to fix.
func TestControllerRefusesUnsafeBoot(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "loose.key")
	require.NoError(t, os.WriteFile(loose, []byte(strings.Repeat("k", 48)), 0o644))
	short := filepath.Join(dir, "short.key")
	require.NoError(t, os.WriteFile(short, []byte("too-short"), 0o600))
	good := filepath.Join(dir, "good.key")
	require.NoError(t, os.WriteFile(good, []byte(strings.Repeat("g", 48)), 0o600))
	base := map[string]string{
		"STATE_DIR":           filepath.Join(dir, "state"),
		"GITEA_URL":           "http://127.0.0.1:1",
		"GITEA_RUNNER_BIN":    "/bin/true",
		"GITEA_RUNNER_SHA256": strings.Repeat("0", 64),
		"NATS_URL":            "nats://127.0.0.1:1",
	}
	for _, tc := range []struct {
		name string
		set  map[string]string
		want string
	}{
		{"world-readable capability key", map[string]string{"RUNNER_FACADE_CAPABILITY_KEY_FILE": loose, "TASK_ENCRYPTION_KEY_FILE": good}, "chmod 600"},
		{"short capability key", map[string]string{"RUNNER_FACADE_CAPABILITY_KEY_FILE": short, "TASK_ENCRYPTION_KEY_FILE": good}, "at least 32"},
		{"missing task key file", map[string]string{"RUNNER_FACADE_CAPABILITY_KEY_FILE": good, "TASK_ENCRYPTION_KEY_FILE": filepath.Join(dir, "nope")}, "TASK_ENCRYPTION_KEY_FILE"},
		{"half-configured runner credentials", map[string]string{"RUNNER_FACADE_CAPABILITY_KEY_FILE": good, "TASK_ENCRYPTION_KEY_FILE": good, "GITEA_RUNNER_UUID_FILE": good}, "GITEA_RUNNER_TOKEN_FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := maps.Clone(base)
			maps.Copy(env, tc.set)
			err := runController(t.Context(), nil, func(k string) string { return env[k] })
			require.ErrorContains(t, err, tc.want, "the controller booted, or its error does not say what to fix")
			assert.NotContains(t, err.Error(), strings.Repeat("g", 48), "the error shows a key")
			assert.NotContains(t, err.Error(), strings.Repeat("k", 48), "the error shows a key")
		})
	}
}
