package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/podworker"
)

// destroyMargin is how long Destroy waits for a Pod to disappear beyond its grace period (the
// kubelet's work after the executor stopped).
const destroyMargin = 60 * time.Second

// Destroy deletes the environment's Pod (the executor gets SIGTERM and Config.Grace before it
// is killed) and its Secret, and waits until the Pod is gone, at most Config.Grace plus a
// minute. Destroying an environment that is gone, or never existed, returns nil. A Pod or
// Secret of that name without the backend's labels is left alone, with an error wrapping
// ErrNotManaged; a newer Pod of the same name than the handle's (Start replaced an ended one) is
// left alone too, with its Secret.
func (b *Backend) Destroy(ctx context.Context, h podworker.Handle) error {
	uid, err := checkHandle(h)
	if err != nil {
		return err
	}
	found, err := b.remove(ctx, h.ID, uid)
	if err != nil {
		return fmt.Errorf("kube: destroy %s: %w", h.ID, err)
	}
	if found {
		b.envLog(h).Info().Msg("environment destroyed")
	}
	return nil
}

// remove deletes Pod name (only the one with uid, when not empty) and its Secret, and waits
// until the Pod is gone. It reports whether it found anything.
func (b *Backend) remove(ctx context.Context, name, uid string) (bool, error) {
	pods := b.client.CoreV1().Pods(b.ns)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	var podUID types.UID
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, err
	case !managed(pod):
		return false, fmt.Errorf("pod %s: %w", name, ErrNotManaged)
	case uid != "" && string(pod.UID) != uid:
		// A newer environment of the same name: not this handle's, nor is its Secret.
		return false, nil
	default:
		podUID = pod.UID
		if pod.DeletionTimestamp == nil {
			err := pods.Delete(ctx, name, metav1.DeleteOptions{
				GracePeriodSeconds: &b.grace,
				Preconditions:      &metav1.Preconditions{UID: &podUID},
			})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return true, fmt.Errorf("delete pod: %w", err)
			}
		}
	}
	sec, err := b.client.CoreV1().Secrets(b.ns).Get(ctx, name, metav1.GetOptions{})
	secFound := false
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return podUID != "", err
	case !managed(sec):
		return podUID != "", fmt.Errorf("secret %s: %w", name, ErrNotManaged)
	case podUID == "" && uid != "" && len(sec.OwnerReferences) == 0:
		// Not the Secret of the handle's Pod, which is gone (that one was owned by it): a
		// newer environment's, whose Pod is being created. List reports it if it stays alone.
	default:
		secFound = true
		if err := b.deleteSecret(ctx, name, sec.UID); err != nil {
			return true, err
		}
	}
	if podUID == "" {
		return secFound, nil
	}
	return true, b.waitGone(ctx, name, podUID)
}

// deleteSecret deletes Secret name (only the one with uid, when not empty); a missing one is
// not an error.
func (b *Backend) deleteSecret(ctx context.Context, name string, uid types.UID) error {
	opts := metav1.DeleteOptions{}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := b.client.CoreV1().Secrets(b.ns).Delete(ctx, name, opts)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete secret: %w", err)
	}
	return nil
}

// waitGone polls until Pod name with uid no longer exists, at most the grace period plus
// destroyMargin.
func (b *Backend) waitGone(ctx context.Context, name string, uid types.UID) error {
	bound := time.Duration(b.grace)*time.Second + destroyMargin
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	pods := b.client.CoreV1().Pods(b.ns)
	for pause := 20 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		pod, err := pods.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) || (err == nil && pod.UID != uid):
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("pod still terminating after %v (does its node's kubelet run?): %w", bound, ctx.Err())
		}
		if err := clock.Sleep(ctx, pause); err != nil {
			return fmt.Errorf("pod still terminating after %v (does its node's kubelet run?): %w", bound, err)
		}
	}
}

// List returns the backend's Pods in the namespace, ended or not, and its Secrets that have no
// Pod (a crash between creating the Secret and the Pod) as Handles with nil Data, in name
// order. Objects whose name and labels disagree are listed with task and epoch zero, for the
// worker to reap.
func (b *Backend) List(ctx context.Context) ([]podworker.Handle, error) {
	// Secrets first: an environment started in between shows up as its Pod.
	secrets, err := b.client.CoreV1().Secrets(b.ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("kube: list: %w", err)
	}
	pods, err := b.client.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("kube: list: %w", err)
	}
	var out []podworker.Handle
	seen := make(map[string]bool)
	for i := range pods.Items {
		p := &pods.Items[i]
		seen[p.Name] = true
		out = append(out, handle(p))
	}
	for i := range secrets.Items {
		s := &secrets.Items[i]
		if seen[s.Name] {
			continue
		}
		task, epoch := taskOf(s)
		out = append(out, podworker.Handle{Backend: backendName, ID: s.Name, Task: task, Epoch: epoch})
	}
	slices.SortFunc(out, func(a, b podworker.Handle) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
