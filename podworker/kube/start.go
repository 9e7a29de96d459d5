package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/dynrunner/dynrunner/podworker"
)

// startAttempts bounds how often Start goes round when concurrent Starts or Destroys change the
// Pod under it.
const startAttempts = 5

// cleanupTimeout bounds the removal of a half-created environment after a failed Start.
const cleanupTimeout = 30 * time.Second

// Start creates the environment's Secret and Pod. When the environment's Pod already exists
// and has not ended (a retried dispatch, a concurrent Start), Start returns its handle and
// creates nothing. When it exists but has ended or is being deleted, Start removes it and its
// Secret and starts afresh.
func (b *Backend) Start(ctx context.Context, spec podworker.Spec) (podworker.Handle, error) {
	if err := validateSpec(spec); err != nil {
		return podworker.Handle{}, err
	}
	name := podName(spec.Task, spec.Epoch)
	began := time.Now()
	for range startAttempts {
		h, created, err := b.startOnce(ctx, spec, name)
		switch {
		case errors.Is(err, errRaced):
			continue
		case err != nil:
			return podworker.Handle{}, fmt.Errorf("kube: start %s: %w", name, err)
		case created:
			b.envLog(h).Info().Dur("took", time.Since(began)).Msg("environment started")
		default:
			b.envLog(h).Info().Msg("environment already running")
		}
		return h, nil
	}
	return podworker.Handle{}, fmt.Errorf("kube: start %s: the pod kept changing under %d attempts", name, startAttempts)
}

// errRaced reports that a concurrent Start or Destroy changed the Pod; Start looks again.
var errRaced = errors.New("raced")

// startOnce returns the handle of the environment's live Pod, creating it (created true) when
// there is none.
func (b *Backend) startOnce(ctx context.Context, spec podworker.Spec, name string) (podworker.Handle, bool, error) {
	pods := b.client.CoreV1().Pods(b.ns)
	cur, err := pods.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return podworker.Handle{}, false, err
	case !b.ours(cur, spec):
		return podworker.Handle{}, false, fmt.Errorf("pod %s: %w", name, ErrNotManaged)
	case live(cur):
		if err := b.ownSecret(ctx, cur); err != nil {
			b.envLog(handle(cur)).Warn().Err(err).Msg("secret not owned by its pod; Destroy removes it")
		}
		return handle(cur), false, nil
	default:
		// Ended, or being deleted: left over from an earlier attempt.
		if _, err := b.remove(ctx, name, string(cur.UID)); err != nil {
			return podworker.Handle{}, false, fmt.Errorf("wipe: %w", err)
		}
	}
	if err := b.putSecret(ctx, spec); err != nil {
		return podworker.Handle{}, false, err
	}
	created, err := pods.Create(ctx, b.pod(spec), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return podworker.Handle{}, false, errRaced
	}
	if err != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if derr := b.deleteSecret(cctx, name, ""); derr != nil {
			err = errors.Join(err, fmt.Errorf("clean up: %w", derr))
		}
		return podworker.Handle{}, false, err
	}
	h := handle(created)
	if err := b.ownSecret(ctx, created); err != nil {
		b.envLog(h).Warn().Err(err).Msg("secret not owned by its pod; Destroy removes it")
	}
	return h, true, nil
}

// ours reports whether pod is the environment of spec that this backend made.
func (b *Backend) ours(pod *corev1.Pod, spec podworker.Spec) bool {
	task, epoch := taskOf(pod)
	return managed(pod) && task == spec.Task && epoch == spec.Epoch
}

// live reports whether pod neither ended nor is being deleted.
func live(pod *corev1.Pod) bool {
	return pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// putSecret creates the environment's Secret, or updates the one a crashed or concurrent
// Start left (the Pod does not exist yet, or a concurrent Start just created it).
func (b *Backend) putSecret(ctx context.Context, spec podworker.Spec) error {
	secrets := b.client.CoreV1().Secrets(b.ns)
	want := b.secret(spec)
	_, err := secrets.Create(ctx, want, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := secrets.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = secrets.Create(ctx, want, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("secrets"), want.Name, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if !managed(cur) {
			return fmt.Errorf("secret %s: %w", want.Name, ErrNotManaged)
		}
		if len(cur.OwnerReferences) > 0 {
			// Owned by a Pod: a concurrent Start's (leave it), or a gone one's (a garbage
			// collector may delete it any moment: replace it).
			pod, err := b.client.CoreV1().Pods(b.ns).Get(ctx, want.Name, metav1.GetOptions{})
			if err == nil && ownedBy(cur, pod.UID) {
				return nil
			}
			if err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			if err := b.deleteSecret(ctx, want.Name, cur.UID); err != nil {
				return err
			}
			return apierrors.NewConflict(corev1.Resource("secrets"), want.Name, errors.New("replaced a stale secret"))
		}
		cur.Data, cur.Labels, cur.Annotations = want.Data, want.Labels, want.Annotations
		_, err = secrets.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// ownSecret makes pod the owner of its Secret, so a garbage collector removes the Secret with
// the Pod even when no Destroy comes.
func (b *Backend) ownSecret(ctx context.Context, pod *corev1.Pod) error {
	secrets := b.client.CoreV1().Secrets(b.ns)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := secrets.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !managed(cur) {
			return fmt.Errorf("secret %s: %w", pod.Name, ErrNotManaged)
		}
		if ownedBy(cur, pod.UID) {
			return nil
		}
		cur.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		}}
		_, err = secrets.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

func ownedBy(m metav1.Object, uid types.UID) bool {
	for _, r := range m.GetOwnerReferences() {
		if r.Kind == "Pod" && r.UID == uid {
			return true
		}
	}
	return false
}
