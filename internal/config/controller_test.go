package config

import (
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/grants"
	"github.com/dynrunner/dynrunner/scheduler"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func base() map[string]string {
	return map[string]string{
		"STATE_DIR":           "/var/lib/dynrunner",
		"GITEA_URL":           "https://gitea.example",
		"GITEA_RUNNER_BIN":    "/opt/gitea-runner",
		"GITEA_RUNNER_SHA256": strings.Repeat("ab", 32),
	}
}

func TestLoadControllerDefaults(t *testing.T) {
	c, err := LoadController(envOf(base()))
	require.NoError(t, err)
	assert.Equal(t, []string{Facade, PodWorker, Scheduler}, c.Components)
	assert.Equal(t, 4, c.PodConcurrency)
	assert.Equal(t, 1, c.VMConcurrency)
	assert.Equal(t, 120*time.Second, c.Pickup)
	assert.Equal(t, 300*time.Second, c.Lease)
	assert.Equal(t, 15*time.Second, c.SchedulerLease)
	assert.Equal(t, 30*time.Second, c.LivenessTTL)
	assert.True(t, c.Embedded())
	assert.True(t, c.GenerateKeys)
	assert.True(t, c.DevCA)
	assert.Equal(t, "https://127.0.0.1:8443", c.FacadeURL)
	assert.Equal(t, []string{"https://127.0.0.1:8443"}, c.FacadeURLs)
	assert.Equal(t, "spiffe://dynrunner.local/dynrunner/facade", c.FacadeID.String())
}

// TestLoadControllerFacadeList: RUNNER_FACADE_URL names several facades, normalized.
func TestLoadControllerFacadeList(t *testing.T) {
	env := base()
	env["RUNNER_FACADE_URL"] = " https://facade-a:8443/, https://facade-b:8443,https://facade-a:8443"
	c, err := LoadController(envOf(env))
	require.NoError(t, err)
	assert.Equal(t, []string{"https://facade-a:8443", "https://facade-b:8443"}, c.FacadeURLs)
	assert.Equal(t, "https://facade-a:8443,https://facade-b:8443", c.FacadeURL, "normalized, for the environments")
}

// TestLoadControllerFailsClosed: every half-configured or unsafe setting is a boot error
// that names what to set.
func TestLoadControllerFailsClosed(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]string
		want string // the variable the message must name
	}{
		{"runner uuid without token", map[string]string{"GITEA_RUNNER_UUID_FILE": "/run/uuid"}, "GITEA_RUNNER_TOKEN_FILE"},
		{"runner token without uuid", map[string]string{"GITEA_RUNNER_TOKEN_FILE": "/run/token"}, "GITEA_RUNNER_UUID_FILE"},
		{"credentials and registration token", map[string]string{"GITEA_RUNNER_UUID_FILE": "/a", "GITEA_RUNNER_TOKEN_FILE": "/b", "GITEA_RUNNER_REGISTRATION_TOKEN_FILE": "/c"}, "GITEA_RUNNER_REGISTRATION_TOKEN_FILE"},
		{"nats user without password", map[string]string{"NATS_URL": "nats://n:4222", "NATS_USER": "u", "RUNNER_FACADE_CAPABILITY_KEY_FILE": "/k", "TASK_ENCRYPTION_KEY_FILE": "/t"}, "NATS_PASSWORD_FILE"},
		{"nats password without user", map[string]string{"NATS_URL": "nats://n:4222", "NATS_PASSWORD_FILE": "/p", "RUNNER_FACADE_CAPABILITY_KEY_FILE": "/k", "TASK_ENCRYPTION_KEY_FILE": "/t"}, "NATS_USER"},
		{"nats credentials for the embedded server", map[string]string{"NATS_USER": "u", "NATS_PASSWORD_FILE": "/p"}, "NATS_URL"},
		{"external nats without a shared capability key", map[string]string{"NATS_URL": "nats://n:4222", "TASK_ENCRYPTION_KEY_FILE": "/t"}, "RUNNER_FACADE_CAPABILITY_KEY_FILE"},
		{"external nats without a shared task key", map[string]string{"NATS_URL": "nats://n:4222", "RUNNER_FACADE_CAPABILITY_KEY_FILE": "/k"}, "TASK_ENCRYPTION_KEY_FILE"},
		{"plain http facade", map[string]string{"RUNNER_FACADE_URL": "http://127.0.0.1:8443"}, "RUNNER_FACADE_URL"},
		{"plain http facade in a list", map[string]string{"RUNNER_FACADE_URL": "https://a:8443,http://b:8443"}, "RUNNER_FACADE_URL"},
		{"empty entry in the facade list", map[string]string{"RUNNER_FACADE_URL": "https://a:8443,,https://b:8443"}, "RUNNER_FACADE_URL"},
		{"facade list with a path", map[string]string{"RUNNER_FACADE_URL": "https://a:8443/facade"}, "RUNNER_FACADE_URL"},
		{"plain http guest facade in a list", map[string]string{"COMPONENTS": "all,vm-worker", "VM_IMAGE": "/b.qcow2", "RUNNER_FACADE_GUEST_URL": "https://10.213.0.1:8444,http://10.213.0.2:8444"}, "RUNNER_FACADE_GUEST_URL"},
		{"facade id in another trust domain", map[string]string{"RUNNER_FACADE_SPIFFE_ID": "spiffe://other.org/facade"}, "RUNNER_FACADE_SPIFFE_ID"},
		{"development CA outside the local backend", map[string]string{"POD_BACKEND": "kubernetes"}, "POD_BACKEND"},
		{"pickup above lease", map[string]string{"PICKUP_SECS": "200", "LEASE_SECS": "150"}, "PICKUP_SECS"},
		{"pickup below floor", map[string]string{"PICKUP_SECS": "30"}, "PICKUP_SECS"},
		{"scheduler lease below floor", map[string]string{"SCHEDULER_LEASE_SECS": "2"}, "SCHEDULER_LEASE_SECS"},
		{"scheduler lease not a number", map[string]string{"SCHEDULER_LEASE_SECS": "15s"}, "SCHEDULER_LEASE_SECS"},
		{"scheduler lease and keepalive past gitea's timeout", map[string]string{"SCHEDULER_LEASE_SECS": "550", "KEEPALIVE_SECS": "60"}, "SCHEDULER_LEASE_SECS"},
		{"no gitea url", map[string]string{"GITEA_URL": ""}, "GITEA_URL"},
		{"gitea url with a query", map[string]string{"GITEA_URL": "https://gitea.example/?x=1"}, "GITEA_URL"},
		{"runner binary without its hash", map[string]string{"GITEA_RUNNER_SHA256": ""}, "GITEA_RUNNER_SHA256"},
		{"runner without binary", map[string]string{"GITEA_RUNNER_BIN": ""}, "GITEA_RUNNER_BIN"},
		{"unknown component", map[string]string{"COMPONENTS": "scheduler,frobnicator"}, "COMPONENTS"},
		{"vm worker without an image", map[string]string{"COMPONENTS": "all,vm-worker"}, "VM_IMAGE"},
		{"opensandbox without a server", map[string]string{"VM_BACKEND": "opensandbox"}, "OPENSANDBOX_URL"},
		{"opensandbox without a key file", map[string]string{"VM_BACKEND": "opensandbox", "OPENSANDBOX_URL": "https://sandbox.example"}, "OPENSANDBOX_API_KEY_FILE"},
		{"opensandbox without the sandbox network", map[string]string{"VM_BACKEND": "opensandbox", "OPENSANDBOX_URL": "https://sandbox.example", "OPENSANDBOX_API_KEY_FILE": "/k"}, "OPENSANDBOX_SANDBOX_CIDR"},
		{"opensandbox start timeout above pickup", map[string]string{"VM_BACKEND": "opensandbox", "OPENSANDBOX_START_TIMEOUT": "5m"}, "OPENSANDBOX_START_TIMEOUT"},
		{"opensandbox key in the url", map[string]string{"VM_BACKEND": "opensandbox", "OPENSANDBOX_URL": "https://user:key@sandbox.example"}, "OPENSANDBOX_URL"},
		{"unknown vm backend", map[string]string{"VM_IMAGE": "/b.qcow2", "VM_BACKEND": "firecracker"}, "VM_BACKEND"},
		{"nonce endpoint on a wildcard", map[string]string{"VM_IMAGE": "/var/lib/dynrunner/base.qcow2", "VM_NONCE_LISTEN": "0.0.0.0:7001"}, "VM_NONCE_LISTEN"},
		{"nonce endpoint off the bridge", map[string]string{"VM_IMAGE": "/var/lib/dynrunner/base.qcow2", "VM_NONCE_LISTEN": "127.0.0.1:7001"}, "VM_NONCE_LISTEN"},
		{"relative vm image", map[string]string{"VM_IMAGE": "../base.qcow2"}, "VM_IMAGE"},
		{"kernel without initramfs", map[string]string{"VM_IMAGE": "/b.qcow2", "VM_KERNEL": "/vmlinuz"}, "VM_INITRAMFS"},
		{"unknown tier", map[string]string{"TIERS": "pod,gpu"}, "TIERS"},
		{"grants file missing", map[string]string{"GRANTS_FILE": "/nonexistent/grants.yaml"}, "GRANTS_FILE"},
		{"opensandbox isolation misspelt", map[string]string{"VM_BACKEND": "opensandbox", "OPENSANDBOX_ISOLATION": "microvm"}, "OPENSANDBOX_ISOLATION"},
		{"kubernetes without a namespace", map[string]string{"POD_BACKEND": "kubernetes", "POD_SPIFFE_CSI": "true", "SPIFFE_ENDPOINT_SOCKET": "unix:///run/spire/agent.sock", "RUNNER_FACADE_URL": "https://facade.dynrunner:8443", "POD_EXECUTOR_IMAGE": "dynrunner/executor@sha256:" + strings.Repeat("a", 64)}, "POD_NAMESPACE"},
		{"kubernetes image by tag", map[string]string{"POD_BACKEND": "kubernetes", "POD_NAMESPACE": "ci", "POD_EXECUTOR_IMAGE": "dynrunner/executor:latest"}, "POD_EXECUTOR_IMAGE"},
		{"kubernetes with the development CA", map[string]string{"POD_BACKEND": "kubernetes", "POD_NAMESPACE": "ci", "POD_EXECUTOR_IMAGE": "dynrunner/executor@sha256:" + strings.Repeat("a", 64)}, "development CA is refused"},
		{"kubernetes with a loopback facade", map[string]string{"POD_BACKEND": "kubernetes", "POD_NAMESPACE": "ci", "POD_SPIFFE_CSI": "true", "SPIFFE_ENDPOINT_SOCKET": "unix:///run/spire/agent.sock", "POD_EXECUTOR_IMAGE": "dynrunner/executor@sha256:" + strings.Repeat("a", 64)}, "RUNNER_FACADE_URL"},
		{"kubernetes with a loopback facade in the list", map[string]string{"POD_BACKEND": "kubernetes", "POD_NAMESPACE": "ci", "POD_SPIFFE_CSI": "true", "SPIFFE_ENDPOINT_SOCKET": "unix:///run/spire/agent.sock", "POD_EXECUTOR_IMAGE": "dynrunner/executor@sha256:" + strings.Repeat("a", 64),
			"RUNNER_FACADE_URL": "https://facade-a.dynrunner:8443,https://127.0.0.1:8443"}, "cannot reach a loopback facade (https://127.0.0.1:8443)"},
		{"kubernetes bad quantity", map[string]string{"POD_BACKEND": "kubernetes", "POD_KUBE_MEMORY_LIMIT": "lots"}, "POD_KUBE_MEMORY_LIMIT"},
		{"embedded nats on a public address", map[string]string{"NATS_EMBEDDED_LISTEN": "0.0.0.0:4222"}, "NATS_EMBEDDED_LISTEN"},
		{"split facade with a registration token", map[string]string{"COMPONENTS": "facade", "GITEA_RUNNER_REGISTRATION_TOKEN_FILE": "/r"}, "GITEA_RUNNER_UUID_FILE"},
		{"replicas on the embedded server", map[string]string{"NATS_REPLICAS": "3"}, "NATS_REPLICAS"},
		{"bad fetch interval", map[string]string{"FETCH_INTERVAL": "fast"}, "FETCH_INTERVAL"},
		{"liveness ttl not a duration", map[string]string{"LIVENESS_TTL": "30"}, "LIVENESS_TTL"},
		{"liveness ttl below the floor", map[string]string{"LIVENESS_TTL": "1s"}, "LIVENESS_TTL"},
		{"liveness ttl above the ceiling", map[string]string{"LIVENESS_TTL": "1h"}, "LIVENESS_TTL"},
		{"gitea url with credentials", map[string]string{"GITEA_URL": "https://admin:hunter2-secret@gitea.example"}, "must not hold credentials"},
		{"gitea url with credentials, not even a URL", map[string]string{"GITEA_URL": "https://admin:hunter2-secret@gitea.example:port"}, "GITEA_URL is not a URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := base()
			for k, v := range tc.set {
				env[k] = v
			}
			_, err := LoadController(envOf(env))
			require.Error(t, err, "configuration accepted")
			assert.NotContains(t, err.Error(), "hunter2", "the error echoes a password")
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// TestGrantsFile: GRANTS_FILE is loaded at boot into the policy the scheduler and the workers
// check; a file that does not parse refuses the boot, naming the variable and the problem.
func TestGrantsFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "grants.yaml")
	require.NoError(t, os.WriteFile(good, []byte("owners:\n  contractors: [vm]\n"), 0o600))
	env := base()
	env["GRANTS_FILE"] = good
	c, err := LoadController(envOf(env))
	require.NoError(t, err)
	require.NotNil(t, c.Grants)
	assert.Equal(t, `owners["contractors"]`, c.Grants.For(grants.Subject{Repo: "contractors/app"}).Rule)

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("owners:\n  contractors: [container]\n"), 0o600))
	env["GRANTS_FILE"] = bad
	_, err = LoadController(envOf(env))
	require.ErrorContains(t, err, `GRANTS_FILE: `+bad+`: grants policy: owners["contractors"]: tier "container": want pod or vm`)

	c, err = LoadController(envOf(base()))
	require.NoError(t, err)
	assert.Nil(t, c.Grants, "without GRANTS_FILE every tier is granted")
}

// TestGrantsNeedRealVMIsolation: with grants, a vm worker on OpenSandbox boots only when the
// operator declares the pool's sandboxes microVMs; the local launcher always boots microVMs.
func TestGrantsNeedRealVMIsolation(t *testing.T) {
	grantsFile := filepath.Join(t.TempDir(), "grants.yaml")
	require.NoError(t, os.WriteFile(grantsFile, []byte("forks: [vm]\n"), 0o600))
	env := base()
	for k, v := range map[string]string{
		"VM_BACKEND": "opensandbox", "OPENSANDBOX_URL": "https://sandbox.example", "OPENSANDBOX_API_KEY_FILE": "/k",
		"OPENSANDBOX_SANDBOX_CIDR": "10.9.0.0/16", "VM_NONCE_LISTEN": "10.9.0.1:7001", "RUNNER_FACADE_GUEST_LISTEN": "10.9.0.1:8444",
	} {
		env[k] = v
	}
	_, err := LoadController(envOf(env))
	require.NoError(t, err, "OpenSandbox without grants boots as before")

	env["GRANTS_FILE"] = grantsFile
	_, err = LoadController(envOf(env))
	require.ErrorContains(t, err, "GRANTS_FILE with VM_BACKEND=opensandbox")
	require.ErrorContains(t, err, "OPENSANDBOX_ISOLATION=vm")

	env["OPENSANDBOX_ISOLATION"] = "vm"
	c, err := LoadController(envOf(env))
	require.NoError(t, err)
	assert.Equal(t, "vm", c.VM.OpenSandbox.Isolation)
}

// TestAdmission: the admission queue is off by default; fairness and a share cap without a
// queue, or a bad FAIRNESS, refuse the boot.
func TestAdmission(t *testing.T) {
	c, err := LoadController(envOf(base()))
	require.NoError(t, err)
	assert.False(t, c.Admission.Enabled(), "the admission queue is on by default")

	env := base()
	env["MAX_QUEUED"], env["QUEUE_SECS"], env["FAIRNESS"], env["FAIR_SHARE_CAP"] = "50", "600", "owner", "3"
	c, err = LoadController(envOf(env))
	require.NoError(t, err)
	assert.Equal(t, scheduler.Admission{MaxQueued: 50, Queue: 10 * time.Minute, Fairness: scheduler.FairnessOwner, ShareCap: 3}, c.Admission)

	env["FAIRNESS"] = "team"
	_, err = LoadController(envOf(env))
	require.ErrorContains(t, err, `FAIRNESS="team": want owner`)

	env = base()
	env["FAIRNESS"] = "owner"
	_, err = LoadController(envOf(env))
	require.ErrorContains(t, err, "FAIRNESS=owner needs an admission queue")
	env = base()
	env["FAIR_SHARE_CAP"] = "2"
	_, err = LoadController(envOf(env))
	require.ErrorContains(t, err, "FAIR_SHARE_CAP=2 needs an admission queue")
	env = base()
	env["QUEUE_SECS"] = "5"
	_, err = LoadController(envOf(env))
	require.ErrorContains(t, err, "QUEUE_SECS")
}

func TestAutoscale(t *testing.T) {
	c, err := LoadController(envOf(base()))
	require.NoError(t, err)
	assert.Equal(t, CapacityStatic, c.AdmitCapacity)
	assert.Empty(t, c.Autoscale.Backend, "the actuator is on by default")

	on := func() map[string]string {
		env := base()
		env["MAX_QUEUED"], env["ADMIT_CAPACITY"], env["AUTOSCALE"], env["AUTOSCALE_DOCKER_TEMPLATE"] = "20", "workers", "docker", "pod-worker-template"
		env["COMPONENTS"] = "scheduler,facade"
		return env
	}
	c, err = LoadController(envOf(on()))
	require.NoError(t, err)
	assert.Equal(t, Autoscale{Backend: "docker", Min: 0, Max: DefaultAutoscaleMax, Cooldown: time.Minute, Template: "pod-worker-template", Socket: "/var/run/docker.sock"}, c.Autoscale)
	assert.Equal(t, CapacityWorkers, c.AdmitCapacity)

	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"AUTOSCALE": "k8s"}, `AUTOSCALE="k8s": want docker`},
		{map[string]string{"ADMIT_CAPACITY": "static"}, "AUTOSCALE=docker needs ADMIT_CAPACITY=workers"},
		{map[string]string{"ADMIT_CAPACITY": "heartbeats"}, `ADMIT_CAPACITY="heartbeats"`},
		{map[string]string{"MAX_QUEUED": "0"}, "ADMIT_CAPACITY=workers needs an admission queue"},
		{map[string]string{"AUTOSCALE_MIN": "5", "AUTOSCALE_MAX": "2"}, "AUTOSCALE_MIN=5 is above AUTOSCALE_MAX=2"},
		{map[string]string{"AUTOSCALE_COOLDOWN": "10ms"}, `AUTOSCALE_COOLDOWN="10ms"`},
		{map[string]string{"AUTOSCALE_DOCKER_TEMPLATE": ""}, "AUTOSCALE_DOCKER_TEMPLATE"},
		{map[string]string{"AUTOSCALE_DOCKER_SOCKET": "docker.sock"}, "AUTOSCALE_DOCKER_SOCKET"},
		{map[string]string{"COMPONENTS": "facade"}, "AUTOSCALE=docker runs in the scheduler"},
		{map[string]string{"COMPONENTS": "all"}, "AUTOSCALE=docker with pod-worker in COMPONENTS"},
		{map[string]string{"AUTOSCALE_COOLDOWN": "5s"}, "AUTOSCALE_COOLDOWN=5s is not above a heartbeat's interval"},
	} {
		env := on()
		maps.Copy(env, tc.set)
		_, err := LoadController(envOf(env))
		require.ErrorContains(t, err, tc.want, "%v", tc.set)
	}
}
