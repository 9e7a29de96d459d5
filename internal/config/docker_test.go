package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadDockerPodBackend(t *testing.T) {
	image := "sha256:" + strings.Repeat("0f", 32)
	with := func(kv ...string) map[string]string {
		m := base()
		delete(m, "GITEA_RUNNER_BIN") // the runner is inside the image
		m["POD_BACKEND"], m["POD_EXECUTOR_IMAGE"] = "docker", image
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	c, err := LoadController(envOf(with()))
	require.NoError(t, err)
	want := DockerPod{Socket: "/var/run/docker.sock", Image: image, Network: "dynrunner", MemoryMiB: 4096, CPUs: 2, Pids: 4096, Scope: "default"}
	assert.Equal(t, "docker", c.PodBackend)
	assert.Equal(t, want, c.Docker)
	assert.True(t, c.DevCA)
	c, err = LoadController(envOf(with("POD_DOCKER_NETWORK", "ci-net", "RUNNER_FACADE_URL", "https://10.0.0.5:8443", "POD_DOCKER_PRIVILEGED", "true",
		"POD_DOCKER_SOCKET", "unix:///run/docker.sock",
		"POD_DOCKER_MEMORY_MIB", "2048", "POD_DOCKER_CPUS", "1.5", "POD_DOCKER_PIDS", "512", "POD_DOCKER_USER", "0:0",
		"POD_EXECUTOR_IMAGE", "registry.example/dynrunner/executor@sha256:"+strings.Repeat("1", 64))))
	require.NoError(t, err)
	d := c.Docker
	assert.Equal(t, "/run/docker.sock", d.Socket)
	assert.Equal(t, "ci-net", d.Network)
	assert.True(t, d.Privileged)
	assert.Equal(t, 2048, d.MemoryMiB)
	assert.InDelta(t, 1.5, d.CPUs, 0)
	assert.Equal(t, 512, d.Pids)
	assert.Equal(t, "0:0", d.User)
	c, err = LoadController(envOf(with("POD_DOCKER_SUBNET", "10.210.0.0/24")))
	require.NoError(t, err)
	assert.Equal(t, "10.210.0.0/24", c.Docker.Subnet.String())
	// With SPIRE's Workload API, environments get attested SVIDs instead of development-CA files.
	c, err = LoadController(envOf(with("SPIFFE_ENDPOINT_SOCKET", "unix:///run/spire/sockets/agent.sock")))
	require.NoError(t, err)
	assert.False(t, c.DevCA)
	assert.Equal(t, "unix:///run/spire/sockets/agent.sock", c.SpiffeEndpointSocket)
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"no image", with("POD_EXECUTOR_IMAGE", ""), "POD_EXECUTOR_IMAGE"},
		{"tag", with("POD_EXECUTOR_IMAGE", "dynrunner-executor:dev"), "a tag is refused"},
		{"privileged typo", with("POD_DOCKER_PRIVILEGED", "yes"), "POD_DOCKER_PRIVILEGED"},
		{"network", with("POD_DOCKER_NETWORK", "container:x"), "POD_DOCKER_NETWORK"},
		{"cpus", with("POD_DOCKER_CPUS", "0"), "POD_DOCKER_CPUS"},
		{"memory", with("POD_DOCKER_MEMORY_MIB", "8"), "POD_DOCKER_MEMORY_MIB"},
		{"user", with("POD_DOCKER_USER", "runner"), "POD_DOCKER_USER"},
		{"workload api socket in /", with("SPIFFE_ENDPOINT_SOCKET", "unix:///agent.sock"), "SPIFFE_ENDPOINT_SOCKET"},
		{"workload api over tcp", with("SPIFFE_ENDPOINT_SOCKET", "tcp://127.0.0.1:8081"), "SPIFFE_ENDPOINT_SOCKET"},
		{"no runner sha", with("GITEA_RUNNER_SHA256", ""), "GITEA_RUNNER_SHA256 must be the 64-hex-digit SHA-256 of the Gitea runner in the executor image"},
		{"loopback facade without the facade", with("COMPONENTS", "pod-worker", "NATS_URL", "nats://127.0.0.1:4222"), "cannot reach a loopback facade"},
		{"a loopback facade in the list without the facade", with("COMPONENTS", "pod-worker", "NATS_URL", "nats://127.0.0.1:4222",
			"RUNNER_FACADE_URL", "https://10.0.0.5:8443,https://localhost:8443"), "cannot reach a loopback facade (https://localhost:8443)"},
		{"subnet not a network", with("POD_DOCKER_SUBNET", "10.1.2.3/24"), "POD_DOCKER_SUBNET"},
		{"subnet too small", with("POD_DOCKER_SUBNET", "10.1.2.0/30"), "POD_DOCKER_SUBNET"},
		{"subnet v6", with("POD_DOCKER_SUBNET", "fd00::/64"), "POD_DOCKER_SUBNET"},
		{"relative socket", with("POD_DOCKER_SOCKET", "docker.sock"), "POD_DOCKER_SOCKET"},
		{"unknown backend", with("POD_BACKEND", "kubernetes"), "POD_BACKEND"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadController(envOf(tt.env))
			assert.ErrorContains(t, err, tt.want)
		})
	}
	// The local backend still needs the host's runner.
	m := base()
	delete(m, "GITEA_RUNNER_BIN")
	_, err = LoadController(envOf(m))
	assert.ErrorContains(t, err, "GITEA_RUNNER_BIN", "the local backend without GITEA_RUNNER_BIN")
}
