package kubetest_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
)

// fakeEnv makes the test binary, inside the test image, play the program it names.
const fakeEnv = "KUBETEST_FAKE"

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeEnv); mode != "" {
		os.Exit(fake(mode))
	}
	code := m.Run()
	kubetest.RemoveTestBinaryImage()
	os.Exit(code)
}

// fake plays a program inside a Pod.
func fake(mode string) int {
	switch mode {
	case "forever":
		for {
			time.Sleep(time.Hour)
		}
	case "check":
		// What TestKubelet's Pod asks for: the fieldRef, the secret file, a writable emptyDir.
		fmt.Println("hello from", os.Getenv("POD_NAME"))
		b, err := os.ReadFile("/secrets/token")
		if err != nil || string(b) != "s3cret" {
			fmt.Fprintf(os.Stderr, "secret: %q, %v\n", b, err)
			return 1
		}
		if fi, err := os.Stat("/secrets/token"); err != nil || fi.Mode().Perm() != 0o600 {
			fmt.Fprintf(os.Stderr, "secret mode: %v, %v\n", fi, err)
			return 1
		}
		if err := os.WriteFile("/scratch/f", []byte("x"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "bye")
		return 7
	case "init-copy":
		// TestKubeletInitContainers' init container: the Secret into the shared emptyDir.
		b, err := os.ReadFile("/secrets/token")
		if err == nil {
			err = os.WriteFile("/shared/token", b, 0o600)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "init-fail":
		return 3
	case "after-init":
		// Its container: the copy is there and can be removed; the Secret is not mounted.
		b, err := os.ReadFile("/shared/token")
		if err != nil || string(b) != "s3cret" {
			fmt.Fprintf(os.Stderr, "copy: %q, %v\n", b, err)
			return 1
		}
		if err := os.Remove("/shared/token"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if _, err := os.Stat("/secrets"); !os.IsNotExist(err) {
			fmt.Fprintf(os.Stderr, "/secrets: %v\n", err)
			return 1
		}
		return 7
	}
	return 2
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestCluster(t *testing.T) {
	c := kubetest.Start(t)
	v, err := c.Client.Discovery().ServerVersion()
	require.NoError(t, err, "server version %v, %v; want %s", v, err, kubetest.KubeVersion)
	require.Equal(t, kubetest.KubeVersion, v.GitVersion, "server version %v, %v; want %s", v, err, kubetest.KubeVersion)
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	require.NoError(t, err)
	admin := kubernetes.NewForConfigOrDie(cfg)
	_, err = admin.CoreV1().ServiceAccounts("default").Get(ctxT(t), "default", metav1.GetOptions{})
	assert.NoError(t, err, "the default ServiceAccount through the kubeconfig")
	ns := c.Namespace(t)
	user := kubernetes.NewForConfigOrDie(c.UserConfig())
	_, err = user.CoreV1().Pods(ns).List(ctxT(t), metav1.ListOptions{})
	assert.True(t, apierrors.IsForbidden(err), "the unprivileged user lists pods: %v, want Forbidden", err)
}

func TestKubelet(t *testing.T) {
	c := kubetest.Start(t)
	image := kubetest.TestBinaryImage(t)
	k := kubetest.StartKubelet(t, c, kubetest.KubeletConfig{})
	ns := c.Namespace(t)
	pods := c.Client.CoreV1().Pods(ns)

	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tok"}, Data: map[string][]byte{"token": []byte("s3cret")}}
	_, err := c.Client.CoreV1().Secrets(ns).Create(ctxT(t), sec, metav1.CreateOptions{})
	require.NoError(t, err)
	mode := int32(0o600)
	pod := newPod("check", k.NodeName(), image, "check")
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: "POD_NAME",
		ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}})
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tok", DefaultMode: &mode}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "sec", MountPath: "/secrets", ReadOnly: true}, {Name: "scratch", MountPath: "/scratch"}}
	_, err = pods.Create(ctxT(t), pod, metav1.CreateOptions{})
	require.NoError(t, err)
	got := waitPod(t, c, ns, "check", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	assertExitCode(t, got, 7)
	tail := int64(10)
	r, err := pods.GetLogs("check", &corev1.PodLogOptions{TailLines: &tail}).Stream(ctxT(t))
	require.NoError(t, err, "pods/log")
	logs, _ := io.ReadAll(r)
	r.Close()
	// stdout ("hello from check") and stderr ("bye") are separate streams: the engine keeps
	// each in order but not their interleaving.
	lines := strings.Split(strings.TrimSpace(string(logs)), "\n")
	slices.Sort(lines)
	assert.Equal(t, []string{"bye", "hello from check"}, lines, "pods/log = %q", logs)

	// A running Pod deleted with a grace period: stopped, reported Failed, then gone.
	_, err = pods.Create(ctxT(t), newPod("forever", k.NodeName(), image, "forever"), metav1.CreateOptions{})
	require.NoError(t, err)
	waitPod(t, c, ns, "forever", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	grace := int64(5)
	require.NoError(t, pods.Delete(ctxT(t), "forever", metav1.DeleteOptions{GracePeriodSeconds: &grace}))
	waitGone(t, c, k, ns, "forever")

	// activeDeadlineSeconds.
	p := newPod("deadline", k.NodeName(), image, "forever")
	one := int64(1)
	p.Spec.ActiveDeadlineSeconds = &one
	_, err = pods.Create(ctxT(t), p, metav1.CreateOptions{})
	require.NoError(t, err)
	got = waitPod(t, c, ns, "deadline", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	assert.EqualValues(t, "DeadlineExceeded", got.Status.Reason, "pod status reason %q, want DeadlineExceeded", got.Status.Reason)

	// A CSI driver the node does not have: the Pod stays Pending, saying why.
	p = newPod("csi", k.NodeName(), image, "forever")
	p.Spec.Volumes = []corev1.Volume{{Name: "spire", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "csi.example.com"}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "spire", MountPath: "/spire"}}
	_, err = pods.Create(ctxT(t), p, metav1.CreateOptions{})
	require.NoError(t, err)
	waitPod(t, c, ns, "csi", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && strings.Contains(cs[0].State.Waiting.Message, "csi.example.com")
	})
}

// TestKubeletCSI checks that a CSI volume of a mapped driver is its host directory.
func TestKubeletCSI(t *testing.T) {
	c := kubetest.Start(t)
	image := kubetest.TestBinaryImage(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "token"), []byte("s3cret"), 0o600))
	k := kubetest.StartKubelet(t, c, kubetest.KubeletConfig{NodeName: "csi-node", CSIDrivers: map[string]string{"csi.example.com": dir}})
	ns := c.Namespace(t)
	p := newPod("csi", k.NodeName(), image, "check")
	ro := true
	p.Spec.Volumes = []corev1.Volume{
		{Name: "spire", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "csi.example.com", ReadOnly: &ro}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "spire", MountPath: "/secrets"}, {Name: "scratch", MountPath: "/scratch"}}
	_, err := c.Client.CoreV1().Pods(ns).Create(ctxT(t), p, metav1.CreateOptions{})
	require.NoError(t, err)
	got := waitPod(t, c, ns, "csi", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	assertExitCode(t, got, 7)
}

// TestKubeletInitContainers checks that init containers run to their end before the
// container, share a memory-backed emptyDir with it, and that a failing one fails the Pod
// without running its container.
func TestKubeletInitContainers(t *testing.T) {
	c := kubetest.Start(t)
	image := kubetest.TestBinaryImage(t)
	k := kubetest.StartKubelet(t, c, kubetest.KubeletConfig{NodeName: "init-node"})
	ns := c.Namespace(t)
	pods := c.Client.CoreV1().Pods(ns)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tok"}, Data: map[string][]byte{"token": []byte("s3cret")}}
	_, err := c.Client.CoreV1().Secrets(ns).Create(ctxT(t), sec, metav1.CreateOptions{})
	require.NoError(t, err)
	mode := int32(0o600)
	withInit := func(name, initMode string) *corev1.Pod {
		p := newPod(name, k.NodeName(), image, "after-init")
		p.Spec.Volumes = []corev1.Volume{
			{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "tok", DefaultMode: &mode}}},
			{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}
		p.Spec.InitContainers = []corev1.Container{{
			Name: "copy", Image: image, Env: []corev1.EnvVar{{Name: fakeEnv, Value: initMode}},
			VolumeMounts: []corev1.VolumeMount{{Name: "sec", MountPath: "/secrets", ReadOnly: true}, {Name: "shared", MountPath: "/shared"}},
		}}
		return p
	}
	_, err = pods.Create(ctxT(t), withInit("init", "init-copy"), metav1.CreateOptions{})
	require.NoError(t, err)
	got := waitPod(t, c, ns, "init", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	assertExitCode(t, got, 7)

	_, err = pods.Create(ctxT(t), withInit("init-fails", "init-fail"), metav1.CreateOptions{})
	require.NoError(t, err)
	got = waitPod(t, c, ns, "init-fails", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if ics := got.Status.InitContainerStatuses; assert.Len(t, ics, 1) && assert.NotNil(t, ics[0].State.Terminated) {
		assert.EqualValues(t, 3, ics[0].State.Terminated.ExitCode, "the init container's exit code")
	}
	if cs := got.Status.ContainerStatuses; assert.Len(t, cs, 1) {
		assert.Nil(t, cs[0].State.Terminated, "the container ran after a failed init container: %+v", cs[0].State)
	}
	require.NoError(t, pods.Delete(ctxT(t), "init-fails", metav1.DeleteOptions{}))
	waitGone(t, c, k, ns, "init-fails")
}

// assertExitCode checks that the Pod has one container, terminated with code.
func assertExitCode(t *testing.T, p *corev1.Pod, code int32) {
	t.Helper()
	cs := p.Status.ContainerStatuses
	if assert.Len(t, cs, 1, "container statuses %+v, want one terminated with exit code %d", cs, code) &&
		assert.NotNil(t, cs[0].State.Terminated, "container state %+v, want terminated with exit code %d", cs[0].State, code) {
		assert.Equal(t, code, cs[0].State.Terminated.ExitCode, "container exit code")
	}
}

func newPod(name, node, image, mode string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{
				Name: "main", Image: image,
				Env: []corev1.EnvVar{{Name: fakeEnv, Value: mode}},
			}},
		},
	}
}

// waitPod polls the Pod until cond holds, for at most a minute.
func waitPod(t *testing.T, c *kubetest.Cluster, ns, name string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctxT(t), name, metav1.GetOptions{})
		if err == nil && cond(p) {
			return p
		}
		last = p
		sleep(t, 100*time.Millisecond)
	}
	require.Failf(t, "timed out", "pod %s/%s: condition not met within a minute; last status %+v", ns, name, last.Status)
	return nil
}

// waitGone polls until the Pod and its container are gone, for at most a minute.
func waitGone(t *testing.T, c *kubetest.Cluster, k *kubetest.Kubelet, ns, name string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctxT(t), name, metav1.GetOptions{})
		has, herr := k.HasContainer(ctxT(t), ns, name)
		if apierrors.IsNotFound(err) && herr == nil && !has {
			return
		}
		sleep(t, 100*time.Millisecond)
	}
	require.Failf(t, "timed out", "pod %s/%s or its container still exists after a minute", ns, name)
}

// sleep pauses a polling loop.
func sleep(t *testing.T, d time.Duration) {
	select {
	case <-t.Context().Done():
	case <-time.After(d):
	}
}
