package kubetest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// StartScheduler plays kube-scheduler for a one-node Cluster until the test ends: it binds
// every Pod without spec.nodeName to node through the Pods' binding subresource, as the real
// scheduler does (no filtering or scoring: there is one node). Tests of code that creates
// unbound Pods, as production does, run it beside a Kubelet of that node.
func StartScheduler(t *testing.T, c *Cluster, node string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" }))
	inf := factory.Core().V1().Pods().Informer()
	bind := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName != "" || p.DeletionTimestamp != nil {
			return
		}
		// A bind failing because the Pod is gone or already bound needs nothing more; other
		// errors are retried at the informer's next update of the Pod, or logged.
		bctx, bcancel := context.WithTimeout(ctx, 10*time.Second)
		defer bcancel()
		err := c.Client.CoreV1().Pods(p.Namespace).Bind(bctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: node},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
			t.Logf("kubetest: scheduler: bind pod %s/%s to %s: %v", p.Namespace, p.Name, node, err)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    bind,
		UpdateFunc: func(_, obj any) { bind(obj) },
	}); err != nil {
		cancel()
		t.Fatalf("kubetest: scheduler informer: %v", err)
	}
	factory.Start(ctx.Done())
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	syncCtx, cancelSync := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSync()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		t.Fatal("kubetest: scheduler informer did not sync in 30s")
	}
}
