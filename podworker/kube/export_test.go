package kube

import corev1 "k8s.io/api/core/v1"

// DeliverPodEvent hands pod to b's running informer's handlers, as the informer delivers an
// update (or, with deleted, a deletion) it still had queued. It reports false when no
// informer runs.
func DeliverPodEvent(b *Backend, pod *corev1.Pod, deleted bool) bool {
	w := &b.notifier
	w.mu.Lock()
	inf := w.cur
	w.mu.Unlock()
	if inf == nil {
		return false
	}
	if deleted {
		w.deleted(pod)
	} else {
		w.changed(inf.store, pod)
	}
	return true
}
