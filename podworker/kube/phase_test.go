package kube_test

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/kube"
)

// phaseLog records what a Backend reports to Config.OnPhase, per environment.
type phaseLog struct {
	mu  sync.Mutex
	got map[string][]kube.PhaseChange
}

func (l *phaseLog) observe(_ context.Context, h podworker.Handle, c kube.PhaseChange) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got[h.ID] = append(l.got[h.ID], c)
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
// Succeeded; and a Pod deleted mid-job ending in Deleted.
func (e *env) testPhases(t *testing.T) {
	ns := e.c.Namespace(t)
	obs := &phaseLog{got: map[string][]kube.PhaseChange{}}
	b := e.newBackend(t, e.c.Client, ns, func(c *kube.Config) { c.OnPhase = obs.observe })

	t.Run("Succeeded", func(t *testing.T) {
		h := startT(t, b, fakeSpec(61, "brief"))
		if exit := waitT(t, b, h); exit.Code != 0 {
			t.Fatalf("Wait = %+v, want exit code 0", exit)
		}
		got, changes := obs.phases(h)
		t.Logf("reported %+v", changes)
		if want := []string{"Running", "Succeeded"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("phases = %v, want [Pending] %v", got, want)
		}
		for _, c := range changes {
			if c.UID != h.Data["pod_uid"] || c.Node != e.k.NodeName() {
				t.Errorf("%s: uid %q on node %q, want %q on %q", c.Phase, c.UID, c.Node, h.Data["pod_uid"], e.k.NodeName())
			}
		}
		if got, want := changes[1].Reason, "Completed"; got != want {
			t.Errorf("Succeeded with reason %q, want %q", got, want)
		}
	})

	t.Run("Deleted", func(t *testing.T) {
		h := startT(t, b, fakeSpec(62, "forever"))
		ch := make(chan error, 1)
		go func() {
			_, err := b.Wait(ctxT(t), h)
			ch <- err
		}()
		pollT(t, "pod running", func() bool { return getPod(t, e.c, ns, h.ID).Status.Phase == corev1.PodRunning })
		if err := e.c.Client.CoreV1().Pods(ns).Delete(ctxT(t), h.ID, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := <-ch; err != nil && !errors.Is(err, podworker.ErrNotFound) {
			t.Fatalf("Wait: %v", err)
		}
		got, changes := obs.phases(h)
		t.Logf("reported %+v", changes)
		// The kubelet reports the Pod's final phase before it removes it; Wait may return on
		// either.
		ok := len(got) >= 2 && len(got) <= 3 && got[0] == "Running" && got[len(got)-1] == kube.PhaseDeleted
		if ok && len(got) == 3 {
			ok = got[1] == "Failed" || got[1] == "Succeeded"
		}
		if !ok {
			t.Fatalf("phases = %v, want [Pending] Running [Failed or Succeeded] Deleted", got)
		}
		if last := changes[len(changes)-1]; last.UID != h.Data["pod_uid"] || last.Node != e.k.NodeName() {
			t.Errorf("Deleted: uid %q on node %q, want %q on %q", last.UID, last.Node, h.Data["pod_uid"], e.k.NodeName())
		}
	})
}
