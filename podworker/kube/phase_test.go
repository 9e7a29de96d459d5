package kube_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/kube"
	"github.com/dynrunner/dynrunner/podworker/podworkertest"
)

// phaseLog records what a Backend reports to Config.OnPhase, per environment.
type phaseLog struct {
	mu   sync.Mutex
	got  map[string][]kube.PhaseChange
	done map[string][]kube.PhaseChange // those reported with a ctx that was done
}

func (l *phaseLog) observe(ctx context.Context, h podworker.Handle, c kube.PhaseChange) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got[h.ID] = append(l.got[h.ID], c)
	if ctx.Err() != nil {
		if l.done == nil {
			l.done = map[string][]kube.PhaseChange{}
		}
		l.done[h.ID] = append(l.done[h.ID], c)
	}
}

// requireLiveCtx fails t if a phase of h was reported with a ctx that was done.
func (l *phaseLog) requireLiveCtx(t *testing.T, h podworker.Handle) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.done[h.ID], "phases of %s reported with a done ctx", h.ID)
}

// phases returns the phases reported for h, without a leading Pending (which Wait sees only if
// it reads the Pod before the kubelet started it).
func (l *phaseLog) phases(h podworker.Handle) ([]string, []kube.PhaseChange) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cs := l.got[h.ID]
	if len(cs) > 0 && cs[0].Phase == string(corev1.PodPending) {
		cs = cs[1:]
	}
	var ps []string
	for _, c := range cs {
		ps = append(ps, c.Phase)
	}
	return ps, cs
}

// testPhases checks what Wait reports to Config.OnPhase: a job's Pod going Running, then
// Succeeded; and a Pod deleted mid-job ending in Deleted. Notify reports the same.
func (e *env) testPhases(t *testing.T) {
	ns := e.c.Namespace(t)
	obs := &phaseLog{got: map[string][]kube.PhaseChange{}}
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) { c.OnPhase = obs.observe })

	t.Run("Succeeded", func(t *testing.T) {
		h := startT(t, b, fakeSpec(61, "brief"))
		exit := waitT(t, b, h)
		require.Zero(t, exit.Code, "Wait = %+v, want exit code 0", exit)
		checkSucceeded(t, e, obs, h)
	})

	t.Run("SucceededNotified", func(t *testing.T) {
		h := startT(t, b, fakeSpec(63, "brief"))
		got := podworkertest.Receive(t, testTimeout, podworkertest.Notified(t, ctxT(t), b, h), h.ID)
		require.NoError(t, got.Err, "Notify")
		require.Zero(t, got.Exit.Code, "Notify = %+v, want exit code 0", got.Exit)
		checkSucceeded(t, e, obs, h)
	})

	t.Run("Deleted", func(t *testing.T) {
		h := startT(t, b, fakeSpec(62, "forever"))
		ch := make(chan error, 1)
		go func() {
			_, err := b.Wait(ctxT(t), h)
			ch <- err
		}()
		pollT(t, "pod running", func() bool { return getPod(t, e.c, ns, h.ID).Status.Phase == corev1.PodRunning })
		require.NoError(t, e.c.Client.CoreV1().Pods(ns).Delete(ctxT(t), h.ID, metav1.DeleteOptions{}))
		if err := <-ch; err != nil {
			require.ErrorIs(t, err, podworker.ErrNotFound, "Wait")
		}
		got, changes := obs.phases(h)
		t.Logf("reported %+v", changes)
		// The kubelet reports the Pod's final phase before it removes it; Wait may return on
		// either.
		ok := len(got) >= 2 && len(got) <= 3 && got[0] == "Running" && got[len(got)-1] == kube.PhaseDeleted
		if ok && len(got) == 3 {
			ok = got[1] == "Failed" || got[1] == "Succeeded"
		}
		require.True(t, ok, "phases = %v, want [Pending] Running [Failed or Succeeded] Deleted", got)
		last := changes[len(changes)-1]
		assert.Equal(t, h.Data["pod_uid"], last.UID, "Deleted: uid")
		assert.Equal(t, e.k.NodeName(), last.Node, "Deleted: node")
	})
}

// checkSucceeded checks the phases reported for h, a Pod that ran and succeeded.
func checkSucceeded(t *testing.T, e *env, obs *phaseLog, h podworker.Handle) {
	t.Helper()
	got, changes := obs.phases(h)
	t.Logf("reported %+v", changes)
	require.Equal(t, []string{"Running", "Succeeded"}, got, "phases after [Pending]")
	for _, c := range changes {
		assert.Equal(t, h.Data["pod_uid"], c.UID, "%s: uid", c.Phase)
		assert.Equal(t, e.k.NodeName(), c.Node, "%s: node", c.Phase)
	}
	assert.Equal(t, "Completed", changes[1].Reason, "reason of Succeeded")
	obs.requireLiveCtx(t, h)
}
