package kube_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/kube"
)

// testPodSpec checks the Pod and Secret the backend creates, as the apiserver stored them.
func (e *env) testPodSpec(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) {
		c.ActiveDeadline = 90 * time.Minute
		c.Resources = kube.Resources{CPURequest: "250m", CPULimit: "1500m", MemoryRequest: "128Mi", MemoryLimit: "1Gi"}
	})
	spec := fakeSpec(61, "forever")
	spec.Env["HOME"] = "/elsewhere" // the backend's own variables win
	spec.Files = map[string][]byte{"token": []byte("t0ken")}
	h := startT(t, b, spec)
	p := getPod(t, e.c, ns, h.ID)
	assert.Equal(t, "dynrunner-61-1", h.ID, "handle id")
	assert.Equal(t, string(p.UID), h.Data["pod_uid"], "the handle records the pod's uid")
	wantLabels := map[string]string{
		"app.kubernetes.io/managed-by": "dynrunner", "app.kubernetes.io/component": "executor",
		"dynrunner.io/task": "61", "dynrunner.io/epoch": "1",
	}
	for k, v := range wantLabels {
		assert.Equal(t, v, p.Labels[k], "label %s = %q, want %q", k, p.Labels[k], v)
	}
	assert.Equal(t, "dynrunner.assignment.61.*", p.Annotations[kube.AnnotationAssignment], "annotation %s", kube.AnnotationAssignment)
	s := p.Spec
	assert.Equal(t, corev1.RestartPolicyNever, s.RestartPolicy, "restartPolicy %s, want Never", s.RestartPolicy)
	assert.Equal(t, ptr.To[int64](5400), s.ActiveDeadlineSeconds, "activeDeadlineSeconds")
	assert.Equal(t, ptr.To[int64](2), s.TerminationGracePeriodSeconds, "terminationGracePeriodSeconds")
	assert.Equal(t, ptr.To(false), s.AutomountServiceAccountToken, "automountServiceAccountToken")
	assert.Equal(t, e.k.NodeName(), s.NodeName, "nodeName")
	assert.Equal(t, "default", s.ServiceAccountName, "serviceAccountName")
	require.Len(t, s.Containers, 1, "%d containers, want 1", len(s.Containers))
	c := s.Containers[0]
	assert.Equal(t, kube.ContainerName, c.Name, "container name")
	assert.Equal(t, e.image, c.Image, "container image")
	assert.Contains(t, c.Image, "@sha256:", "the image is pinned by digest")
	sc := c.SecurityContext
	if assert.NotNil(t, sc, "securityContext") {
		assert.Equal(t, ptr.To(true), sc.Privileged, "privileged (the default)")
		assert.Equal(t, ptr.To[int64](0), sc.RunAsUser, "as root (the default)")
	}
	for _, q := range []struct {
		list corev1.ResourceList
		name corev1.ResourceName
		want string
	}{
		{c.Resources.Requests, corev1.ResourceCPU, "250m"}, {c.Resources.Limits, corev1.ResourceCPU, "1500m"},
		{c.Resources.Requests, corev1.ResourceMemory, "128Mi"}, {c.Resources.Limits, corev1.ResourceMemory, "1Gi"},
	} {
		got := q.list[q.name]
		assert.Zero(t, got.Cmp(resource.MustParse(q.want)), "resource %s = %s, want %s", q.name, got.String(), q.want)
	}
	env := map[string]string{}
	for _, v := range c.Env {
		env[v.Name] = v.Value
	}
	for k, v := range map[string]string{
		fakeEnv: "forever", "HOME": kube.HomeDir, "TMPDIR": kube.TmpDir,
		"DYNRUNNER_SECRETS_DIR": kube.SecretsDir, "DYNRUNNER_WORK_DIR": kube.WorkDir,
	} {
		assert.Equal(t, v, env[k], "env %s = %q, want %q", k, env[k], v)
	}
	assert.NotContains(t, env, "SPIFFE_ENDPOINT_SOCKET", "set without SpiffeCSI")
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if assert.Contains(t, mounts, kube.SecretsDir, "secrets mount") {
		assert.True(t, mounts[kube.SecretsDir].ReadOnly, "secrets mount %+v, want read-only", mounts[kube.SecretsDir])
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range s.Volumes {
		volumes[v.Name] = v
	}
	sv := volumes[mounts[kube.SecretsDir].Name].Secret
	if assert.NotNil(t, sv, "secrets volume") {
		assert.Equal(t, h.ID, sv.SecretName, "secrets volume's Secret")
		assert.Equal(t, ptr.To[int32](0o600), sv.DefaultMode, "secrets volume's mode")
	}
	for _, dir := range []string{kube.WorkDir, kube.HomeDir, kube.TmpDir} {
		v := volumes[mounts[dir].Name]
		assert.NotNil(t, v.EmptyDir, "volume at %s: %+v, want an emptyDir", dir, v)
	}
	assert.NotContains(t, mounts, kube.SpireSocketDir, "SPIFFE CSI volume mounted without SpiffeCSI")
	sec, err := e.c.Client.CoreV1().Secrets(ns).Get(ctxT(t), h.ID, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "t0ken", string(sec.Data["token"]), "secret's token")
	assert.Equal(t, "61", sec.Labels["dynrunner.io/task"], "secret's task label")
	if refs := sec.OwnerReferences; assert.Len(t, refs, 1, "secret owner references: the pod") {
		assert.Equal(t, "Pod", refs[0].Kind, "secret owner")
		assert.Equal(t, p.UID, refs[0].UID, "secret owner")
	}
}

func (e *env) testSpiffeCSI(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) { c.SpiffeCSI = true })
	h := startT(t, b, fakeSpec(62, "spiffe"))
	p := getPod(t, e.c, ns, h.ID)
	var found bool
	for _, v := range p.Spec.Volumes {
		if v.CSI != nil {
			found = v.CSI.Driver == kube.SpiffeCSIDriver && v.CSI.ReadOnly != nil && *v.CSI.ReadOnly
		}
	}
	assert.True(t, found, "volumes %+v, want a read-only CSI volume of %s", p.Spec.Volumes, kube.SpiffeCSIDriver)
	exit := waitT(t, b, h)
	assert.Zero(t, exit.Code, "the check inside the pod failed: %+v", exit)
}

func (e *env) testUnprivileged(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) { c.Privileged = ptr.To(false) })
	spec := fakeSpec(63, "unprivileged")
	spec.Files = map[string][]byte{"capability-token": []byte("conformance-secret\n")}
	h := startT(t, b, spec)
	p := getPod(t, e.c, ns, h.ID)
	if psc := p.Spec.SecurityContext; assert.NotNil(t, psc, "pod securityContext") {
		assert.Equal(t, ptr.To(true), psc.RunAsNonRoot, "pod securityContext runAsNonRoot")
		assert.NotNil(t, psc.FSGroup, "pod securityContext fsGroup")
	}
	sc := p.Spec.Containers[0].SecurityContext
	require.NotNil(t, sc, "container securityContext")
	assert.Equal(t, ptr.To(false), sc.Privileged, "unprivileged")
	assert.Equal(t, ptr.To(false), sc.AllowPrivilegeEscalation, "no privilege escalation")
	assert.Equal(t, ptr.To(true), sc.ReadOnlyRootFilesystem, "read-only root filesystem")
	require.NotNil(t, sc.Capabilities, "container capabilities")
	assert.Len(t, sc.Capabilities.Drop, 1, "capabilities dropped")
	exit := waitT(t, b, h)
	assert.Zero(t, exit.Code, "the check inside the pod failed: %+v", exit)
}

func (e *env) testDeadline(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) { c.ActiveDeadline = time.Second })
	h := startT(t, b, fakeSpec(64, "forever"))
	exit := waitT(t, b, h)
	assert.Equal(t, "deadline", exit.Reason, "exit %+v", exit)
}

func (e *env) testDiagnose(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, nil)
	h := startT(t, b, fakeSpec(65, "diagnose"))
	exit := waitT(t, b, h)
	assert.Equal(t, 1, exit.Code, "exit %+v", exit)
	assert.Equal(t, "exited", exit.Reason, "exit %+v", exit)
	got, err := b.Diagnose(ctxT(t), h)
	require.NoError(t, err, "Diagnose")
	assert.Equal(t, "dynrunner executor: wait for the SVID: context deadline exceeded", got, "Diagnose: the last error line")
	require.NoError(t, b.Destroy(ctxT(t), h))
	_, err = b.Diagnose(ctxT(t), h)
	assert.ErrorIs(t, err, podworker.ErrNotFound, "Diagnose after Destroy")
}

// testStartReplacesEnded checks that a Start finding its Pod ended creates a new one, and that a
// Destroy with the old handle leaves the new Pod and its Secret alone.
func (e *env) testStartReplacesEnded(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, nil)
	spec := fakeSpec(66, "exit0")
	old := startT(t, b, spec)
	waitT(t, b, old)
	spec.Env[fakeEnv] = "forever"
	spec.Files = map[string][]byte{"token": []byte("x")}
	cur := startT(t, b, spec)
	require.Equal(t, old.ID, cur.ID, "the second Start has the same name")
	require.NotEqual(t, old.Data["pod_uid"], cur.Data["pod_uid"], "the second Start has a new pod")
	require.NoError(t, b.Destroy(ctxT(t), old), "Destroy(old handle)")
	p := getPod(t, e.c, ns, cur.ID)
	require.Equal(t, cur.Data["pod_uid"], string(p.UID), "Destroy of the old handle deleted the new pod")
	require.Nil(t, p.DeletionTimestamp, "Destroy of the old handle deleted the new pod")
	_, err := e.c.Client.CoreV1().Secrets(ns).Get(ctxT(t), cur.ID, metav1.GetOptions{})
	require.NoError(t, err, "Destroy of the old handle removed the new pod's secret")
}

// testListOrphanSecret checks that a Secret without its Pod (a crash between the two
// creations) is listed for reaping, and that Destroy removes it.
func (e *env) testListOrphanSecret(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, nil)
	h := startT(t, b, fakeSpec(67, "forever"))
	orphan := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "dynrunner-68-1", Labels: map[string]string{
		"app.kubernetes.io/managed-by": "dynrunner", "app.kubernetes.io/component": "executor",
		"dynrunner.io/task": "68", "dynrunner.io/epoch": "1",
	}}}
	_, err := e.c.Client.CoreV1().Secrets(ns).Create(ctxT(t), orphan, metav1.CreateOptions{})
	require.NoError(t, err)
	all, err := b.List(ctxT(t))
	require.NoError(t, err)
	require.Len(t, all, 2, "List: the handle and the orphan")
	assert.Equal(t, h.ID, all[0].ID, "List")
	assert.Equal(t, orphan.Name, all[1].ID, "List: the orphan")
	assert.Equal(t, assignment.TaskID(68), all[1].Task, "List: the orphan's task")
	assert.Equal(t, assignment.Epoch(1), all[1].Epoch, "List: the orphan's epoch")
	assert.Nil(t, all[1].Data, "List: the orphan has no data")
	require.NoError(t, b.Destroy(ctxT(t), all[1]))
	all, err = b.List(ctxT(t))
	require.NoError(t, err, "List after Destroy of the orphan")
	assert.Len(t, all, 1, "List after Destroy of the orphan: only %s", h.ID)
}

// testNotManaged checks that the backend never adopts or deletes a Pod that has an
// environment's name but not its labels.
func (e *env) testNotManaged(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, nil)
	foreign := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dynrunner-69-1"},
		Spec: corev1.PodSpec{
			NodeName: e.k.NodeName(), RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "x", Image: e.image, Env: []corev1.EnvVar{{Name: fakeEnv, Value: "exit0"}}}},
		},
	}
	_, err := e.c.Client.CoreV1().Pods(ns).Create(ctxT(t), foreign, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = b.Start(ctxT(t), fakeSpec(69, "forever"))
	assert.ErrorIs(t, err, kube.ErrNotManaged, "Start over a foreign pod")
	h := podworker.Handle{Backend: "kubernetes", ID: foreign.Name, Task: 69, Epoch: 1}
	assert.ErrorIs(t, b.Destroy(ctxT(t), h), kube.ErrNotManaged, "Destroy of a foreign pod")
	assert.Nil(t, getPod(t, e.c, ns, foreign.Name).DeletionTimestamp, "the foreign pod is being deleted")
}

// testCheck checks that Check names what a controller without the Role lacks.
func (e *env) testCheck(t *testing.T) {
	ns := e.c.Namespace(t) // no Role bound to kubetest.User here
	b := e.newBackend(t, kubernetes.NewForConfigOrDie(e.c.UserConfig()), ns, nil)
	err := b.Check(ctxT(t))
	assert.ErrorIs(t, err, kube.ErrForbidden, "Check without permissions")
	assert.ErrorContains(t, err, "create pods", "Check without permissions")
}

// offlineClient is a client of no cluster, for the tests that never reach one.
func offlineClient() kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(&rest.Config{Host: "http://127.0.0.1:1"})
}

func TestNewValidates(t *testing.T) {
	image := "registry.example/dynrunner/executor@sha256:" + strings.Repeat("ab", 32)
	ok := kube.Config{Client: offlineClient(), Namespace: "dynrunner", Image: image}
	tests := []struct {
		name string
		edit func(*kube.Config)
	}{
		{"no client", func(c *kube.Config) { c.Client = nil }},
		{"no namespace", func(c *kube.Config) { c.Namespace = "" }},
		{"bad namespace", func(c *kube.Config) { c.Namespace = "Dyn_Runner" }},
		{"tag only", func(c *kube.Config) { c.Image = "registry.example/dynrunner/executor:v1" }},
		{"no digest", func(c *kube.Config) { c.Image = "registry.example/dynrunner/executor" }},
		{"image id only", func(c *kube.Config) { c.Image = "sha256:" + strings.Repeat("ab", 32) }},
		{"short digest", func(c *kube.Config) { c.Image = "executor@sha256:abc" }},
		{"uppercase digest", func(c *kube.Config) { c.Image = "executor@sha256:" + strings.Repeat("AB", 32) }},
		{"bad cpu", func(c *kube.Config) { c.Resources.CPULimit = "two" }},
		{"zero memory", func(c *kube.Config) { c.Resources.MemoryLimit = "0" }},
		{"request above limit", func(c *kube.Config) { c.Resources.MemoryRequest = "8Gi" }},
		{"negative deadline", func(c *kube.Config) { c.ActiveDeadline = -time.Second }},
		{"negative grace", func(c *kube.Config) { c.Grace = -time.Second }},
		{"bad service account", func(c *kube.Config) { c.ServiceAccount = "Not Valid" }},
		{"bad node", func(c *kube.Config) { c.NodeName = "node_1" }},
		{"bad pull secret", func(c *kube.Config) { c.ImagePullSecrets = []string{"a/b"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := ok
			tt.edit(&cfg)
			_, err := kube.New(cfg)
			assert.ErrorIs(t, err, kube.ErrInvalidConfig, "New(%+v)", cfg)
		})
	}
	for _, img := range []string{image, "executor@sha256:" + strings.Repeat("0", 64),
		"localhost:5000/executor:v1@sha256:" + strings.Repeat("0", 64)} {
		cfg := ok
		cfg.Image = img
		_, err := kube.New(cfg)
		assert.NoError(t, err, "New with image %s", img)
	}
}

func TestRejectsBadInput(t *testing.T) {
	b, err := kube.New(kube.Config{Client: offlineClient(), Namespace: "dynrunner",
		Image: "executor@sha256:" + strings.Repeat("ab", 32)})
	require.NoError(t, err)
	for _, h := range []podworker.Handle{
		{Backend: "docker", ID: "dynrunner-1-1"},
		{Backend: "kubernetes", ID: "../etc"},
		{Backend: "kubernetes", ID: ""},
		{Backend: "kubernetes", ID: "Dynrunner-1-1"},
		{Backend: "kubernetes", ID: "dynrunner-1-1", Data: map[string]string{"pod_uid": ""}},
	} {
		assert.ErrorIs(t, b.Destroy(t.Context(), h), kube.ErrInvalidHandle, "Destroy(%+v)", h)
		_, err := b.Wait(t.Context(), h)
		assert.ErrorIs(t, err, kube.ErrInvalidHandle, "Wait(%+v)", h)
		_, err = b.Diagnose(t.Context(), h)
		assert.ErrorIs(t, err, kube.ErrInvalidHandle, "Diagnose(%+v)", h)
	}
	for _, spec := range []podworker.Spec{
		{Task: 0, Epoch: 1},
		{Task: 1, Epoch: 0},
		{Task: 1, Epoch: 1, Env: map[string]string{"A=B": "x"}},
		{Task: 1, Epoch: 1, Env: map[string]string{"": "x"}},
		{Task: 1, Epoch: 1, Files: map[string][]byte{"a b": nil}},
	} {
		_, err := b.Start(t.Context(), spec)
		assert.ErrorIs(t, err, kube.ErrInvalidSpec, "Start(%+v)", spec)
	}
}
