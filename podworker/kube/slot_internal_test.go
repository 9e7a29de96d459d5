package kube

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
)

// TestSlotPod: a GitHub slot's Pod mounts its Secret only into the init container, which
// copies it into a memory-backed emptyDir that the executor's container mounts writable at
// SecretsDir (the executor removes the JIT configuration from it before the runner starts);
// the executor's container never mounts the Secret, and the Pod has no SPIFFE CSI volume even
// when the backend has one. HOME is an emptyDir, where the image's launcher copies the
// runner. The environment parses as a slot's. The Pod is built only, for no cluster (the
// apiserver's validation and the run are e2e's TestGitHubJobsRunInKubeSlots).
func TestSlotPod(t *testing.T) {
	for _, privileged := range []bool{true, false} {
		t.Run(map[bool]string{true: "privileged", false: "unprivileged"}[privileged], func(t *testing.T) {
			b, err := New(Config{
				Client:    kubernetes.NewForConfigOrDie(&rest.Config{Host: "http://127.0.0.1:1"}),
				Namespace: "dynrunner", Image: "executor@sha256:" + strings.Repeat("ab", 32),
				SpiffeCSI: true, Privileged: ptr.To(privileged),
			})
			require.NoError(t, err)
			slot := assignment.TaskID(1<<52 + 3)
			cfg := executor.GitHubConfig{Task: slot, Epoch: 9, RunnerBin: "/usr/local/bin/github-runner", RunnerSHA256: strings.Repeat("cd", 32), LogFormat: "json"}
			spec := podworker.Spec{Task: slot, Epoch: 9, Env: cfg.Environ(), Files: map[string][]byte{executor.JITConfigFile: []byte("jit")}}
			p := b.pod(spec)

			volumes := map[string]corev1.Volume{}
			for _, v := range p.Spec.Volumes {
				volumes[v.Name] = v
				assert.Nil(t, v.CSI, "volume %s: a slot gets no SPIFFE CSI volume", v.Name)
			}
			assert.Len(t, volumes, 5, "volumes %+v", p.Spec.Volumes)
			if sv := volumes[volSecrets].Secret; assert.NotNil(t, sv, "the Secret's volume") {
				assert.Equal(t, p.Name, sv.SecretName)
			}
			if ed := volumes[volSlotSecrets].EmptyDir; assert.NotNil(t, ed, "the slot's secrets directory") {
				assert.Equal(t, corev1.StorageMediumMemory, ed.Medium, "memory-backed")
				if assert.NotNil(t, ed.SizeLimit) {
					assert.Zero(t, ed.SizeLimit.Cmp(resource.MustParse("1Mi")), "size limit %s", ed.SizeLimit)
				}
			}

			require.Len(t, p.Spec.Containers, 1)
			c := p.Spec.Containers[0]
			mounts := map[string]corev1.VolumeMount{}
			for _, m := range c.VolumeMounts {
				assert.NotEqual(t, volSecrets, m.Name, "the executor's container mounts the Secret at %s", m.MountPath)
				mounts[m.MountPath] = m
			}
			assert.Equal(t, corev1.VolumeMount{Name: volSlotSecrets, MountPath: SecretsDir}, mounts[SecretsDir], "writable secrets directory")
			assert.NotContains(t, mounts, SpireSocketDir, "a slot gets no Workload API")
			if assert.Contains(t, mounts, HomeDir) {
				assert.NotNil(t, volumes[mounts[HomeDir].Name].EmptyDir, "HOME on an emptyDir")
			}
			env := map[string]string{}
			for _, v := range c.Env {
				env[v.Name] = v.Value
			}
			assert.NotContains(t, env, "SPIFFE_ENDPOINT_SOCKET")
			assert.Equal(t, HomeDir, env["HOME"])
			got, err := executor.ParseGitHubEnv(func(k string) string { return env[k] })
			require.NoError(t, err)
			cfg.SecretsDir, cfg.WorkDir = SecretsDir, WorkDir
			assert.Equal(t, cfg, got)

			require.Len(t, p.Spec.InitContainers, 1)
			ic := p.Spec.InitContainers[0]
			assert.Equal(t, InitContainerName, ic.Name)
			assert.Equal(t, b.image, ic.Image, "the executor image")
			assert.Equal(t, []string{CopyCommand}, ic.Command)
			assert.Equal(t, []string{"-L", "--", SecretsSourceDir + "/" + executor.JITConfigFile, SecretsDir + "/"}, ic.Args)
			assert.ElementsMatch(t, []corev1.VolumeMount{
				{Name: volSecrets, MountPath: SecretsSourceDir, ReadOnly: true},
				{Name: volSlotSecrets, MountPath: SecretsDir},
			}, ic.VolumeMounts)
			assert.Empty(t, ic.Env, "the init container gets no environment")
			if sc := ic.SecurityContext; assert.NotNil(t, sc) {
				assert.Equal(t, ptr.To(false), sc.Privileged)
				assert.Equal(t, ptr.To(false), sc.AllowPrivilegeEscalation)
				assert.Equal(t, ptr.To(true), sc.ReadOnlyRootFilesystem)
				assert.Equal(t, &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, sc.Capabilities)
				if privileged {
					assert.Equal(t, ptr.To[int64](0), sc.RunAsUser, "root, as the privileged executor, whose Secret files are root's")
				} else {
					assert.Nil(t, sc.RunAsUser, "the Pod's runner user")
				}
			}
			assert.Equal(t, c.Resources, ic.Resources, "the executor's resources, which the Pod does not add to")
		})
	}
}

// TestGiteaPodUnchanged: an environment that is not a GitHub slot keeps its read-only Secret
// volume at SecretsDir, the SPIFFE CSI volume and no init container.
func TestGiteaPodUnchanged(t *testing.T) {
	b, err := New(Config{
		Client:    kubernetes.NewForConfigOrDie(&rest.Config{Host: "http://127.0.0.1:1"}),
		Namespace: "dynrunner", Image: "executor@sha256:" + strings.Repeat("ab", 32), SpiffeCSI: true,
	})
	require.NoError(t, err)
	p := b.pod(podworker.Spec{Task: 7, Epoch: 1, Files: map[string][]byte{"capability-token": []byte("t")}})
	assert.Empty(t, p.Spec.InitContainers)
	require.Len(t, p.Spec.Containers, 1)
	assert.Contains(t, p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: volSecrets, MountPath: SecretsDir, ReadOnly: true})
	assert.Contains(t, p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: volSpire, MountPath: SpireSocketDir, ReadOnly: true})
	var names []string
	for _, v := range p.Spec.Volumes {
		names = append(names, v.Name)
	}
	assert.ElementsMatch(t, []string{volSecrets, volWork, volHome, volTmp, volSpire}, names)
}
