package kube_test

import (
	"errors"
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
	if h.ID != "dynrunner-61-1" || h.Data["pod_uid"] != string(p.UID) {
		t.Errorf("handle %+v, want id dynrunner-61-1 and the pod's uid %s", h, p.UID)
	}
	wantLabels := map[string]string{
		"app.kubernetes.io/managed-by": "dynrunner", "app.kubernetes.io/component": "executor",
		"dynrunner.io/task": "61", "dynrunner.io/epoch": "1",
	}
	for k, v := range wantLabels {
		assert.Equal(t, v, p.Labels[k], "label %s = %q, want %q", k, p.Labels[k], v)
	}
	if got := p.Annotations[kube.AnnotationAssignment]; got != "dynrunner.assignment.61.*" {
		t.Errorf("annotation %s = %q", kube.AnnotationAssignment, got)
	}
	s := p.Spec
	assert.Equal(t, corev1.RestartPolicyNever, s.RestartPolicy, "restartPolicy %s, want Never", s.RestartPolicy)
	if s.ActiveDeadlineSeconds == nil || *s.ActiveDeadlineSeconds != 5400 {
		t.Errorf("activeDeadlineSeconds %v, want 5400", s.ActiveDeadlineSeconds)
	}
	if s.TerminationGracePeriodSeconds == nil || *s.TerminationGracePeriodSeconds != 2 {
		t.Errorf("terminationGracePeriodSeconds %v, want 2", s.TerminationGracePeriodSeconds)
	}
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken %v, want false", s.AutomountServiceAccountToken)
	}
	if s.NodeName != e.k.NodeName() || s.ServiceAccountName != "default" {
		t.Errorf("nodeName %q serviceAccountName %q", s.NodeName, s.ServiceAccountName)
	}
	require.Len(t, s.Containers, 1, "%d containers, want 1", len(s.Containers))
	c := s.Containers[0]
	if c.Name != kube.ContainerName || c.Image != e.image || !strings.Contains(c.Image, "@sha256:") {
		t.Errorf("container %s image %s, want %s pinned by digest", c.Name, c.Image, e.image)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged == nil || !*sc.Privileged || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Errorf("securityContext %+v, want privileged as root (the default)", sc)
	}
	for _, q := range []struct {
		list corev1.ResourceList
		name corev1.ResourceName
		want string
	}{
		{c.Resources.Requests, corev1.ResourceCPU, "250m"}, {c.Resources.Limits, corev1.ResourceCPU, "1500m"},
		{c.Resources.Requests, corev1.ResourceMemory, "128Mi"}, {c.Resources.Limits, corev1.ResourceMemory, "1Gi"},
	} {
		if got := q.list[q.name]; got.Cmp(resource.MustParse(q.want)) != 0 {
			t.Errorf("resource %s = %s, want %s", q.name, got.String(), q.want)
		}
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
	if _, ok := env["SPIFFE_ENDPOINT_SOCKET"]; ok {
		t.Error("SPIFFE_ENDPOINT_SOCKET set without SpiffeCSI")
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	if m, ok := mounts[kube.SecretsDir]; !ok || !m.ReadOnly {
		t.Errorf("secrets mount %+v, want read-only at %s", m, kube.SecretsDir)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range s.Volumes {
		volumes[v.Name] = v
	}
	sv := volumes[mounts[kube.SecretsDir].Name].Secret
	if sv == nil || sv.SecretName != h.ID || sv.DefaultMode == nil || *sv.DefaultMode != 0o600 {
		t.Errorf("secrets volume %+v, want Secret %s with mode 0600", sv, h.ID)
	}
	for _, dir := range []string{kube.WorkDir, kube.HomeDir, kube.TmpDir} {
		if v := volumes[mounts[dir].Name]; v.EmptyDir == nil {
			t.Errorf("volume at %s: %+v, want an emptyDir", dir, v)
		}
	}
	if _, ok := mounts[kube.SpireSocketDir]; ok {
		t.Error("SPIFFE CSI volume mounted without SpiffeCSI")
	}
	sec, err := e.c.Client.CoreV1().Secrets(ns).Get(ctxT(t), h.ID, metav1.GetOptions{})
	require.NoError(t, err)
	if string(sec.Data["token"]) != "t0ken" || sec.Labels["dynrunner.io/task"] != "61" {
		t.Errorf("secret data %q labels %v", sec.Data, sec.Labels)
	}
	if refs := sec.OwnerReferences; len(refs) != 1 || refs[0].Kind != "Pod" || refs[0].UID != p.UID {
		t.Errorf("secret owner references %+v, want the pod %s", refs, p.UID)
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
	if !found {
		t.Errorf("volumes %+v, want a read-only CSI volume of %s", p.Spec.Volumes, kube.SpiffeCSIDriver)
	}
	if exit := waitT(t, b, h); exit.Code != 0 {
		t.Errorf("the check inside the pod failed: %+v", exit)
	}
}

func (e *env) testUnprivileged(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) { c.Privileged = ptr.To(false) })
	spec := fakeSpec(63, "unprivileged")
	spec.Files = map[string][]byte{"capability-token": []byte("conformance-secret\n")}
	h := startT(t, b, spec)
	p := getPod(t, e.c, ns, h.ID)
	if psc := p.Spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.FSGroup == nil {
		t.Errorf("pod securityContext %+v, want runAsNonRoot with an fsGroup", psc)
	}
	sc := p.Spec.Containers[0].SecurityContext
	if sc == nil || *sc.Privileged || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("container securityContext %+v, want unprivileged and hardened", sc)
	}
	if exit := waitT(t, b, h); exit.Code != 0 {
		t.Errorf("the check inside the pod failed: %+v", exit)
	}
}

func (e *env) testDeadline(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) { c.ActiveDeadline = time.Second })
	h := startT(t, b, fakeSpec(64, "forever"))
	if exit := waitT(t, b, h); exit.Reason != "deadline" {
		t.Errorf("exit = %+v, want reason deadline", exit)
	}
}

func (e *env) testDiagnose(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, nil)
	h := startT(t, b, fakeSpec(65, "diagnose"))
	if exit := waitT(t, b, h); exit.Code != 1 || exit.Reason != "exited" {
		t.Errorf("exit = %+v, want code 1, exited", exit)
	}
	got, err := b.Diagnose(ctxT(t), h)
	if want := "dynrunner executor: wait for the SVID: context deadline exceeded"; err != nil || got != want {
		t.Errorf("Diagnose = %q, %v; want %q (the last error line)", got, err, want)
	}
	require.NoError(t, b.Destroy(ctxT(t), h))
	if _, err := b.Diagnose(ctxT(t), h); !errors.Is(err, podworker.ErrNotFound) {
		t.Errorf("Diagnose after Destroy = %v, want ErrNotFound", err)
	}
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
	if cur.ID != old.ID || cur.Data["pod_uid"] == old.Data["pod_uid"] {
		t.Fatalf("second Start = %+v, first %+v: want the same name and a new pod", cur, old)
	}
	require.NoError(t, b.Destroy(ctxT(t), old), "Destroy(old handle)")
	if p := getPod(t, e.c, ns, cur.ID); string(p.UID) != cur.Data["pod_uid"] || p.DeletionTimestamp != nil {
		t.Fatal("Destroy of the old handle deleted the new pod")
	}
	if _, err := e.c.Client.CoreV1().Secrets(ns).Get(ctxT(t), cur.ID, metav1.GetOptions{}); err != nil {
		t.Fatalf("Destroy of the old handle removed the new pod's secret: %v", err)
	}
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
	if _, err := e.c.Client.CoreV1().Secrets(ns).Create(ctxT(t), orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	all, err := b.List(ctxT(t))
	require.NoError(t, err)
	if len(all) != 2 || all[0].ID != h.ID || all[1].ID != orphan.Name || all[1].Task != 68 || all[1].Epoch != 1 || all[1].Data != nil {
		t.Fatalf("List = %+v, want %s and the orphan %s (task 68, no data)", all, h.ID, orphan.Name)
	}
	require.NoError(t, b.Destroy(ctxT(t), all[1]))
	if all, err := b.List(ctxT(t)); err != nil || len(all) != 1 {
		t.Errorf("List after Destroy of the orphan = %+v, %v; want only %s", all, err, h.ID)
	}
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
	if _, err := e.c.Client.CoreV1().Pods(ns).Create(ctxT(t), foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Start(ctxT(t), fakeSpec(69, "forever")); !errors.Is(err, kube.ErrNotManaged) {
		t.Errorf("Start over a foreign pod = %v, want ErrNotManaged", err)
	}
	h := podworker.Handle{Backend: "kubernetes", ID: foreign.Name, Task: 69, Epoch: 1}
	if err := b.Destroy(ctxT(t), h); !errors.Is(err, kube.ErrNotManaged) {
		t.Errorf("Destroy of a foreign pod = %v, want ErrNotManaged", err)
	}
	if p := getPod(t, e.c, ns, foreign.Name); p.DeletionTimestamp != nil {
		t.Error("the foreign pod is being deleted")
	}
}

// testCheck checks that Check names what a controller without the Role lacks.
func (e *env) testCheck(t *testing.T) {
	ns := e.c.Namespace(t) // no Role bound to kubetest.User here
	b := e.newBackend(t, kubernetes.NewForConfigOrDie(e.c.UserConfig()), ns, nil)
	err := b.Check(ctxT(t))
	if !errors.Is(err, kube.ErrForbidden) || !strings.Contains(err.Error(), "create pods") {
		t.Errorf("Check without permissions = %v, want ErrForbidden naming create pods", err)
	}
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
			if _, err := kube.New(cfg); !errors.Is(err, kube.ErrInvalidConfig) {
				t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
			}
		})
	}
	for _, img := range []string{image, "executor@sha256:" + strings.Repeat("0", 64),
		"localhost:5000/executor:v1@sha256:" + strings.Repeat("0", 64)} {
		cfg := ok
		cfg.Image = img
		if _, err := kube.New(cfg); err != nil {
			t.Errorf("New with image %s: %v", img, err)
		}
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
		if err := b.Destroy(t.Context(), h); !errors.Is(err, kube.ErrInvalidHandle) {
			t.Errorf("Destroy(%+v) = %v, want ErrInvalidHandle", h, err)
		}
		if _, err := b.Wait(t.Context(), h); !errors.Is(err, kube.ErrInvalidHandle) {
			t.Errorf("Wait(%+v) = %v, want ErrInvalidHandle", h, err)
		}
		if _, err := b.Diagnose(t.Context(), h); !errors.Is(err, kube.ErrInvalidHandle) {
			t.Errorf("Diagnose(%+v) = %v, want ErrInvalidHandle", h, err)
		}
	}
	for _, spec := range []podworker.Spec{
		{Task: 0, Epoch: 1},
		{Task: 1, Epoch: 0},
		{Task: 1, Epoch: 1, Env: map[string]string{"A=B": "x"}},
		{Task: 1, Epoch: 1, Env: map[string]string{"": "x"}},
		{Task: 1, Epoch: 1, Files: map[string][]byte{"a b": nil}},
	} {
		if _, err := b.Start(t.Context(), spec); !errors.Is(err, kube.ErrInvalidSpec) {
			t.Errorf("Start(%+v) = %v, want ErrInvalidSpec", spec, err)
		}
	}
}
