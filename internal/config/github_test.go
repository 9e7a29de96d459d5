package config

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github"
)

func TestGitHub(t *testing.T) {
	c, err := LoadController(envOf(base()))
	require.NoError(t, err)
	assert.False(t, c.GitHub.Enabled(), "GitHub is on by default")

	app := func() map[string]string {
		env := base()
		env["GITHUB_CONFIG_URL"], env["GITHUB_APP_ID"], env["GITHUB_APP_INSTALLATION_ID"], env["GITHUB_APP_PRIVATE_KEY_FILE"] =
			"https://github.com/acme", "4242", "77", "/etc/dynrunner/github-app.pem"
		env["GITHUB_RUNNER_BIN"], env["GITHUB_RUNNER_SHA256"] = "/opt/actions-runner/run.sh", strings.Repeat("AB", 32)
		return env
	}
	c, err = LoadController(envOf(app()))
	require.NoError(t, err)
	assert.Equal(t, GitHub{URL: "https://github.com/acme",
		Auth:        github.Auth{AppID: "4242", InstallationID: 77, PrivateKeyFile: "/etc/dynrunner/github-app.pem"},
		RunnerGroup: "Default", ScaleSetPrefix: "dynrunner", Idle: 10 * time.Minute, JobLease: 6 * time.Hour,
		RunnerBin: "/opt/actions-runner/run.sh", RunnerSHA256: strings.Repeat("ab", 32),
		VMRunnerBin: "/opt/actions-runner/run.sh", VMRunnerSHA256: strings.Repeat("ab", 32), Reruns: 2}, c.GitHub)

	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"GITHUB_CONFIG_URL": "http://github.com/acme"}, "GITHUB_CONFIG_URL"},
		{map[string]string{"GITHUB_CONFIG_URL": "http://10.0.0.1/acme"}, "http only for a loopback host"},
		{map[string]string{"GITHUB_CONFIG_URL": "https://user:pw@github.com/acme"}, "GITHUB_CONFIG_URL"},
		{map[string]string{"GITHUB_APP_INSTALLATION_ID": "seventy"}, "GITHUB_APP_INSTALLATION_ID"},
		{map[string]string{"GITHUB_APP_INSTALLATION_ID": ""}, "GITHUB_APP_INSTALLATION_ID"},
		{map[string]string{"GITHUB_TOKEN_FILE": "/etc/token"}, "use one"},
		{map[string]string{"GITHUB_APP_ID": "", "GITHUB_APP_INSTALLATION_ID": "", "GITHUB_APP_PRIVATE_KEY_FILE": ""}, "no credentials"},
		{map[string]string{"GITHUB_CONFIG_URL": ""}, "without GITHUB_CONFIG_URL"},
		{map[string]string{"GITHUB_IDLE_SECS": "10"}, "GITHUB_IDLE_SECS"},
		{map[string]string{"GITHUB_RUNNER_BIN": ""}, "GITHUB_RUNNER_BIN is required"},
		{map[string]string{"GITHUB_RUNNER_SHA256": "abc"}, "GITHUB_RUNNER_SHA256 must be"},
		{map[string]string{"GITHUB_IDLE_SECS": "7200", "GITHUB_JOB_LEASE_SECS": "3600"}, "must be below GITHUB_JOB_LEASE_SECS"},
		{map[string]string{"GITHUB_RERUNS": "-1"}, "GITHUB_RERUNS"},
		{map[string]string{"GITHUB_RERUNS": "11"}, "GITHUB_RERUNS=11: want at most 10"},
		{map[string]string{"GITHUB_RERUNS": "two"}, "GITHUB_RERUNS"},
	} {
		env := app()
		maps.Copy(env, tc.set)
		_, err := LoadController(envOf(env))
		require.ErrorContains(t, err, tc.want, "%v", tc.set)
	}

	// The vm worker's pin of the runner in the guest image: by default the pod tier's SHA-256
	// at /opt/actions-runner/run.sh, or its own.
	vm := app()
	vm["VM_IMAGE"] = "/var/lib/dynrunner/base.qcow2"
	c, err = LoadController(envOf(vm))
	require.NoError(t, err)
	assert.Contains(t, c.Components, VMWorker)
	assert.True(t, c.GitHub.VMSlots())
	assert.Equal(t, "/opt/actions-runner/run.sh", c.GitHub.VMRunnerBin)
	assert.Equal(t, strings.Repeat("ab", 32), c.GitHub.VMRunnerSHA256)
	vm["GITHUB_VM_RUNNER_BIN"], vm["GITHUB_VM_RUNNER_SHA256"] = "/srv/runner/run.sh", strings.Repeat("CD", 32)
	c, err = LoadController(envOf(vm))
	require.NoError(t, err)
	assert.Equal(t, "/srv/runner/run.sh", c.GitHub.VMRunnerBin)
	assert.Equal(t, strings.Repeat("cd", 32), c.GitHub.VMRunnerSHA256)
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"GITHUB_VM_RUNNER_SHA256": "abc"}, "GITHUB_VM_RUNNER_SHA256 must be"},
		{map[string]string{"GITHUB_VM_RUNNER_BIN": "run.sh"}, "GITHUB_VM_RUNNER_BIN=\"run.sh\": want the absolute path"},
		{map[string]string{"GITHUB_RUNNER_SHA256": "", "GITHUB_RUNNER_BIN": "", "COMPONENTS": "scheduler,facade,vm-worker"},
			"GITHUB_VM_RUNNER_SHA256 (or GITHUB_RUNNER_SHA256) is required"},
	} {
		env := maps.Clone(vm)
		delete(env, "GITHUB_VM_RUNNER_BIN")
		delete(env, "GITHUB_VM_RUNNER_SHA256")
		maps.Copy(env, tc.set)
		_, err := LoadController(envOf(env))
		require.ErrorContains(t, err, tc.want, "%v", tc.set)
	}
	// A vm worker alone needs no pod tier's runner.
	vmOnly := maps.Clone(vm)
	vmOnly["COMPONENTS"], vmOnly["GITHUB_RUNNER_BIN"], vmOnly["GITHUB_RUNNER_SHA256"] = "scheduler,facade,vm-worker", "", ""
	_, err = LoadController(envOf(vmOnly))
	require.NoError(t, err)

	off := app()
	off["GITHUB_RERUNS"] = "0"
	c, err = LoadController(envOf(off))
	require.NoError(t, err)
	assert.Zero(t, c.GitHub.Reruns, "GITHUB_RERUNS=0 does not turn reruns off")

	loop := app()
	loop["GITHUB_CONFIG_URL"] = "http://127.0.0.1:8080/acme"
	_, err = LoadController(envOf(loop))
	require.NoError(t, err, "a loopback http URL (development) was refused")

	token := base()
	token["GITHUB_CONFIG_URL"], token["GITHUB_TOKEN_FILE"] = "https://ghes.example.com/acme/app", "/etc/dynrunner/github-token"
	token["COMPONENTS"] = "scheduler,facade" // no worker: no runner pin needed
	c, err = LoadController(envOf(token))
	require.NoError(t, err)
	assert.Equal(t, github.Auth{TokenFile: "/etc/dynrunner/github-token"}, c.GitHub.Auth)
	assert.False(t, c.GitHub.Slots())

	// A worker of its own serves slots with the runner's pin alone, and refuses credentials.
	worker := base()
	worker["COMPONENTS"] = "pod-worker"
	worker["NATS_URL"], worker["RUNNER_FACADE_CAPABILITY_KEY_FILE"], worker["TASK_ENCRYPTION_KEY_FILE"] = "nats://10.0.0.5:4222", "/k/cap", "/k/task"
	worker["GITHUB_RUNNER_BIN"], worker["GITHUB_RUNNER_SHA256"] = "/opt/actions-runner/run.sh", strings.Repeat("ab", 32)
	c, err = LoadController(envOf(worker))
	require.NoError(t, err)
	assert.True(t, c.GitHub.Slots())
	assert.False(t, c.GitHub.Enabled())
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"GITHUB_CONFIG_URL": "https://github.com/acme", "GITHUB_TOKEN_FILE": "/etc/token"}, "without the scheduler"},
		{map[string]string{"GITHUB_RUNNER_SHA256": ""}, "GITHUB_RUNNER_SHA256 must be"},
	} {
		env := maps.Clone(worker)
		maps.Copy(env, tc.set)
		_, err := LoadController(envOf(env))
		require.ErrorContains(t, err, tc.want, "%v", tc.set)
	}

	// The kubernetes backend serves slots too: their Pods copy the Secret into a writable
	// secrets directory (podworker/kube).
	kube := maps.Clone(worker)
	maps.Copy(kube, map[string]string{"POD_BACKEND": "kubernetes", "POD_NAMESPACE": "ci", "POD_SPIFFE_CSI": "true",
		"SPIFFE_ENDPOINT_SOCKET": "unix:///run/spire/agent.sock", "RUNNER_FACADE_URL": "https://facade.dynrunner:8443",
		"POD_EXECUTOR_IMAGE": "dynrunner/executor@sha256:" + strings.Repeat("a", 64)})
	c, err = LoadController(envOf(kube))
	require.NoError(t, err, "a kubernetes worker with the runner's pin")
	assert.True(t, c.GitHub.Slots())
}
