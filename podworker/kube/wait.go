package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/podworker"
)

// Bounds of Wait's retries while the apiserver cannot be reached, and of each watch.
const (
	maxWaitRetry = 5 * time.Second
	watchTimeout = 5 * time.Minute
)

// Wait blocks until the environment's Pod has ended or ctx is done, and returns the executor's
// exit code from the container status. It works the same for handles of this Backend and
// adopted ones (the cluster keeps the state). Reasons: "exited", "oom" (the container was
// killed for memory), "deadline" (activeDeadlineSeconds passed), "evicted", "deleted" (the Pod
// was deleted while it ran and ended so). When the Pod is gone, or replaced by a newer one of
// the same name, Wait returns Exit{Reason: "deleted"} (with the last exit code it saw, or -1)
// and an error wrapping podworker.ErrNotFound. While the apiserver cannot be reached Wait
// retries until ctx ends rather than report the environment lost; watches that end (timeouts,
// expired resource versions, apiserver restarts) are resumed. Wait reports the Pod's phases to
// Config.OnPhase, when set (see PhaseChange).
func (b *Backend) Wait(ctx context.Context, h podworker.Handle) (podworker.Exit, error) {
	uid, err := checkHandle(h)
	if err != nil {
		return podworker.Exit{}, err
	}
	pods := b.client.CoreV1().Pods(b.ns)
	ph := &phases{fn: b.onPhase, h: h, uid: uid}
	pause := 100 * time.Millisecond
	for {
		pod, err := pods.Get(ctx, h.ID, metav1.GetOptions{})
		switch {
		case ctx.Err() != nil:
			return podworker.Exit{}, fmt.Errorf("kube: wait %s: %w", h.ID, ctx.Err())
		case apierrors.IsNotFound(err):
			ph.gone(ctx, "")
			return deleted(h, nil)
		case err != nil && !transient(err):
			return podworker.Exit{}, fmt.Errorf("kube: wait %s: %w", h.ID, err)
		case err != nil:
			b.envLog(h).Warn().Err(err).Dur("retry_in", pause).Msg("get pod failed; retrying")
			if err := clock.Sleep(ctx, pause); err != nil {
				return podworker.Exit{}, fmt.Errorf("kube: wait %s: %w", h.ID, err)
			}
			pause = min(2*pause, maxWaitRetry)
			continue
		case uid != "" && string(pod.UID) != uid:
			ph.gone(ctx, reasonReplaced)
			return deleted(h, nil)
		}
		ph.saw(ctx, pod)
		if exit, done := exitOf(pod); done {
			ph.ended(ctx, pod)
			return exit, nil
		}
		exit, done, err := b.watchPod(ctx, h, uid, pod.ResourceVersion, ph)
		if done {
			return exit, err
		}
		if ctx.Err() != nil {
			return podworker.Exit{}, fmt.Errorf("kube: wait %s: %w", h.ID, ctx.Err())
		}
		if err != nil {
			b.envLog(h).Debug().Err(err).Dur("retry_in", pause).Msg("watch ended; resuming")
			if err := clock.Sleep(ctx, pause); err != nil {
				return podworker.Exit{}, fmt.Errorf("kube: wait %s: %w", h.ID, err)
			}
			pause = min(2*pause, maxWaitRetry)
			continue
		}
		pause = 100 * time.Millisecond
	}
}

// watchPod watches Pod h.ID from resource version rv until it ends (done) or the watch does
// (not done; err says why when it was not a normal end).
func (b *Backend) watchPod(ctx context.Context, h podworker.Handle, uid, rv string, ph *phases) (podworker.Exit, bool, error) {
	w, err := b.client.CoreV1().Pods(b.ns).Watch(ctx, metav1.ListOptions{
		FieldSelector:       "metadata.name=" + h.ID,
		ResourceVersion:     rv,
		AllowWatchBookmarks: true,
		TimeoutSeconds:      ptr.To(int64(watchTimeout / time.Second)),
	})
	if err != nil {
		return podworker.Exit{}, false, err
	}
	defer w.Stop()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return podworker.Exit{}, false, ctx.Err()
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			return podworker.Exit{}, false, nil
		}
		if ev.Type == watch.Error {
			return podworker.Exit{}, false, apierrors.FromObject(ev.Object)
		}
		pod, isPod := ev.Object.(*corev1.Pod)
		if !isPod || ev.Type == watch.Bookmark {
			continue
		}
		switch {
		case uid != "" && string(pod.UID) != uid:
			// A newer Pod of the same name: this handle's is gone.
			ph.gone(ctx, reasonReplaced)
			exit, err := deleted(h, nil)
			return exit, true, err
		case ev.Type == watch.Deleted:
			ph.saw(ctx, pod)
			ph.gone(ctx, "")
			exit, err := deleted(h, pod)
			return exit, true, err
		}
		ph.saw(ctx, pod)
		if exit, done := exitOf(pod); done {
			ph.ended(ctx, pod)
			return exit, true, nil
		}
	}
}

// exitOf returns how pod ended, if it did.
func exitOf(pod *corev1.Pod) (podworker.Exit, bool) {
	if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
		return podworker.Exit{}, false
	}
	exit := podworker.Exit{Code: -1, Reason: "exited"}
	if t := terminated(pod); t != nil {
		exit.Code = int(t.ExitCode)
		if t.Reason == "OOMKilled" {
			exit.Reason = podworker.ExitOOM
		}
	}
	switch {
	case pod.Status.Reason == "DeadlineExceeded":
		exit.Reason = podworker.ExitDeadline
	case pod.Status.Reason == "Evicted":
		exit.Reason = "evicted"
	case pod.DeletionTimestamp != nil && exit.Reason == "exited":
		exit.Reason = "deleted"
	}
	return exit, true
}

// terminated returns the executor container's terminated state, if it has one.
func terminated(pod *corev1.Pod) *corev1.ContainerStateTerminated {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == ContainerName {
			return cs.State.Terminated
		}
	}
	return nil
}

// deleted is Wait's answer for a Pod that is gone; last is its final state, if known.
func deleted(h podworker.Handle, last *corev1.Pod) (podworker.Exit, error) {
	exit := podworker.Exit{Code: -1, Reason: "deleted"}
	if last != nil {
		if t := terminated(last); t != nil {
			exit.Code = int(t.ExitCode)
		}
	}
	return exit, fmt.Errorf("kube: wait %s: pod deleted: %w", h.ID, podworker.ErrNotFound)
}

// transient reports whether an apiserver error may go away by itself: it could not be reached,
// was overloaded or answered with a server error.
func transient(err error) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		return true // a transport error
	}
	code := status.Status().Code
	return code >= 500 || code == 429 || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
}
