package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadLocalPodBackend(t *testing.T) {
	with := func(kv ...string) map[string]string {
		m := base()
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	c, err := LoadController(envOf(with()))
	require.NoError(t, err)
	assert.Equal(t, LocalPod{UIDBase: 2_000_000_000, UIDCount: 65536}, c.Local)
	c, err = LoadController(envOf(with("POD_LOCAL_UID_BASE", "100000", "POD_LOCAL_UID_COUNT", "8")))
	require.NoError(t, err)
	assert.Equal(t, LocalPod{UIDBase: 100000, UIDCount: 8}, c.Local)
	for _, tt := range []struct {
		name string
		kv   []string
		want string
	}{
		{"uid 0", []string{"POD_LOCAL_UID_BASE", "0"}, "uid 0 is root"},
		{"not a number", []string{"POD_LOCAL_UID_BASE", "-5"}, "POD_LOCAL_UID_BASE"},
		{"too few for the concurrency", []string{"POD_LOCAL_UID_COUNT", "2", "POD_CONCURRENCY", "3"}, "below POD_CONCURRENCY"},
		{"empty range", []string{"POD_LOCAL_UID_COUNT", "0"}, "below POD_CONCURRENCY"},
		{"past the end", []string{"POD_LOCAL_UID_BASE", "4294967290", "POD_LOCAL_UID_COUNT", "10"}, "past the last uid"},
		{"nobody", []string{"POD_LOCAL_UID_BASE", "60000", "POD_LOCAL_UID_COUNT", "10000"}, "nobody"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadController(envOf(with(tt.kv...)))
			assert.ErrorContains(t, err, tt.want, "LoadController(%v)", tt.kv)
		})
	}
	// Another backend does not check the range.
	m := with("POD_LOCAL_UID_BASE", "0", "POD_BACKEND", "docker", "POD_EXECUTOR_IMAGE", "sha256:"+strings.Repeat("0f", 32))
	delete(m, "GITEA_RUNNER_BIN")
	_, err = LoadController(envOf(m))
	assert.NoError(t, err, "docker backend with POD_LOCAL_UID_BASE=0")
}
