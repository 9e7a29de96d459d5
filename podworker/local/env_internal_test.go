package local

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

// TestEnv: an executor's environment is BaseEnv, the spec's variables in key order and the
// backend's own last, which win (exec keeps the last value of a key); executor.ParseEnv
// reads it back as the worker's configuration with the environment's directories.
func TestEnv(t *testing.T) {
	b := &Backend{baseEnv: []string{"PATH=/bin", "HOME=/base"}}
	got := b.env("/envs/7-9", map[string]string{"B": "2", "A": "1", "HOME": "/spec"})
	assert.Equal(t, []string{
		"PATH=/bin", "HOME=/base", "A=1", "B=2", "HOME=/spec",
		"DYNRUNNER_ENV_DIR=/envs/7-9", "DYNRUNNER_SECRETS_DIR=/envs/7-9/secrets", "DYNRUNNER_WORK_DIR=/envs/7-9/work",
		"HOME=/envs/7-9/home", "TMPDIR=/envs/7-9/tmp",
	}, got)
	assert.Equal(t, executor.EnvDirEntry("/envs/7-9"), (&Backend{root: "/envs"}).marker("7-9"), "marker")

	want := podworkertest.ExecutorConfig(7, 9)
	env := map[string]string{}
	for _, kv := range b.env("/envs/7-9", podworkertest.WorkerEnv(want)) {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	parsed, err := executor.ParseEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	want.SecretsDir, want.WorkDir = "/envs/7-9/secrets", "/envs/7-9/work"
	assert.Equal(t, want, parsed)
}
