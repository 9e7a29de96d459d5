package kube_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/kube"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

const testTimeout = 60 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// env is one cluster with a test kubelet, shared by the subtests of TestKube.
type env struct {
	c     *kubetest.Cluster
	k     *kubetest.Kubelet
	image string
	spire string // the host directory the kubelet's csi.spiffe.io volumes are
}

// TestKube runs the backend against a real etcd and kube-apiserver, with the test kubelet
// running the Pods' containers on the Docker engine. The subtests share the cluster; each
// has a namespace of its own.
func TestKube(t *testing.T) {
	c := kubetest.Start(t)
	image := kubetest.TestBinaryImage(t)
	spire := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(spire, "agent.sock"), nil, 0o644))
	k := kubetest.StartKubelet(t, c, kubetest.KubeletConfig{CSIDrivers: map[string]string{kube.SpiffeCSIDriver: spire}})
	e := &env{c: c, k: k, image: image, spire: spire}
	t.Run("Conformance", e.testConformance)
	t.Run("PodSpec", e.testPodSpec)
	t.Run("DeletedMidJob", e.testDeletedMidJob)
	t.Run("Phases", e.testPhases)
	t.Run("Notify", e.testNotify)
	t.Run("SpiffeCSI", e.testSpiffeCSI)
	t.Run("Unprivileged", e.testUnprivileged)
	t.Run("Deadline", e.testDeadline)
	t.Run("Diagnose", e.testDiagnose)
	t.Run("StartReplacesEnded", e.testStartReplacesEnded)
	t.Run("ListOrphanSecret", e.testListOrphanSecret)
	t.Run("NotManaged", e.testNotManaged)
	t.Run("Check", e.testCheck)
}

// newBackend returns a Backend on namespace ns through client; edit adjusts the Config.
func (e *env) newBackend(t *testing.T, client kubernetes.Interface, ns string, edit func(*kube.Config)) *kube.Backend {
	t.Helper()
	cfg := kube.Config{
		Client:    client,
		Namespace: ns,
		Image:     e.image,
		NodeName:  e.k.NodeName(),
		Grace:     2 * time.Second,
		Resources: kube.Resources{CPURequest: "100m", MemoryRequest: "64Mi", MemoryLimit: "512Mi"},
		Log:       zerolog.New(zerolog.NewTestWriter(t)),
	}
	if edit != nil {
		edit(&cfg)
	}
	b, err := kube.New(cfg)
	require.NoError(t, err, "New")
	return b
}

// modes maps the conformance behaviors to fake executor modes.
var modes = map[podworkertest.Behavior]string{
	podworkertest.RunForever:        "forever",
	podworkertest.ExitZero:          "exit0",
	podworkertest.ExitNonZero:       "exit3",
	podworkertest.CheckSecrets:      "secrets",
	podworkertest.WriteFilesAndExit: "write-files",
}

func fakeSpec(task assignment.TaskID, mode string) podworker.Spec {
	return podworker.Spec{Task: task, Epoch: 1, Env: map[string]string{fakeEnv: mode}}
}

func (e *env) testConformance(t *testing.T) {
	ns := e.c.Namespace(t)
	client := e.c.BindUserRoles(t, ns, map[string][]rbacv1.PolicyRule{"dynrunner-pods": kube.RBACRules()})
	require.NoError(t, e.newBackend(t, client, ns, nil).Check(ctxT(t)), "Check with the permissions of RBACRules")
	began := time.Now()
	podworkertest.RunConformance(t, podworkertest.Harness{
		New: func(t *testing.T) podworker.Backend { return e.newBackend(t, client, ns, nil) },
		Spec: func(t *testing.T, task assignment.TaskID, behavior podworkertest.Behavior) podworker.Spec {
			mode, ok := modes[behavior]
			require.True(t, ok, "no fake executor mode for %v", behavior)
			return fakeSpec(task, mode)
		},
		Gone:           e.gone(ns),
		KnownExitCodes: true,
		Without:        map[string]string{podworkertest.CheckNeverReady: "Start returns once the Pod is created; a Pod that never runs is the worker's pickup timeout, not the backend's"},
		Timeout:        testTimeout,
	})
	t.Logf("conformance took %v", time.Since(began).Round(time.Millisecond))
}

// gone reports whether the environment's Pod, its Secret and its container are gone, looked up
// independently of the package under test.
func (e *env) gone(ns string) func(t *testing.T, h podworker.Handle) bool {
	return func(t *testing.T, h podworker.Handle) bool {
		_, perr := e.c.Client.CoreV1().Pods(ns).Get(ctxT(t), h.ID, metav1.GetOptions{})
		_, serr := e.c.Client.CoreV1().Secrets(ns).Get(ctxT(t), h.ID, metav1.GetOptions{})
		has, err := e.k.HasContainer(ctxT(t), ns, h.ID)
		require.NoError(t, err, "kubelet containers")
		return apierrors.IsNotFound(perr) && apierrors.IsNotFound(serr) && !has
	}
}

func startT(t *testing.T, b *kube.Backend, spec podworker.Spec) podworker.Handle {
	t.Helper()
	h, err := b.Start(ctxT(t), spec)
	require.NoError(t, err, "Start")
	t.Cleanup(func() {
		assert.NoError(t, b.Destroy(context.Background(), h), "cleanup: Destroy")
	})
	return h
}

func waitT(t *testing.T, b *kube.Backend, h podworker.Handle) podworker.Exit {
	t.Helper()
	exit, err := b.Wait(ctxT(t), h)
	require.NoError(t, err, "Wait")
	if exit.Code != 0 {
		why, _ := b.Diagnose(ctxT(t), h)
		t.Logf("exit %+v; executor said %q", exit, why)
	}
	return exit
}

func getPod(t *testing.T, c *kubetest.Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	p, err := c.Client.CoreV1().Pods(ns).Get(ctxT(t), name, metav1.GetOptions{})
	require.NoError(t, err, "get pod %s", name)
	return p
}

// testDeletedMidJob deletes a running Pod behind the backend's back (an operator's kubectl
// delete, a node drain): Wait returns and says so.
func (e *env) testDeletedMidJob(t *testing.T) {
	ns := e.c.Namespace(t)
	b := e.newBackend(t, e.c.Client, ns, nil)
	h := startT(t, b, fakeSpec(51, "forever"))
	ch := make(chan error, 1)
	var exit podworker.Exit
	go func() {
		var err error
		exit, err = b.Wait(ctxT(t), h)
		ch <- err
	}()
	pollT(t, "pod running", func() bool { return getPod(t, e.c, ns, h.ID).Status.Phase == corev1.PodRunning })
	require.NoError(t, e.c.Client.CoreV1().Pods(ns).Delete(ctxT(t), h.ID, metav1.DeleteOptions{}))
	err := <-ch // bounded by Wait's context
	if err != nil {
		require.ErrorIs(t, err, podworker.ErrNotFound, "Wait = %+v; want an exit or ErrNotFound", exit)
	}
	assert.Equal(t, "deleted", exit.Reason, "Wait = %+v, %v", exit, err)
	pollT(t, "pod gone", func() bool {
		_, err := e.c.Client.CoreV1().Pods(ns).Get(ctxT(t), h.ID, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	_, err = b.Wait(ctxT(t), h)
	assert.ErrorIs(t, err, podworker.ErrNotFound, "Wait on the deleted pod")
	assert.ErrorContains(t, err, "deleted", "Wait on the deleted pod")
}

// pollT polls cond until it holds, at most testTimeout.
func pollT(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for pause := 10 * time.Millisecond; !cond(); pause = min(2*pause, 200*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, testTimeout)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(pause):
		}
	}
}
