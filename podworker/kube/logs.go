package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dynrunner/dynrunner/podworker"
)

var _ podworker.Diagnoser = (*Backend)(nil)

// Diagnose returns the executor's own final error line, if it wrote one: the last line of the
// container's log (pods/log, the last podworker.DiagnoseTail lines) that starts with
// podworker.ExecutorErrorPrefix. Kubernetes serves stdout and stderr as one stream (the
// stream selection of pods/log is an alpha feature, PodLogsQuerySplitStreams), so unlike the
// docker backend it cannot leave the job's stdout out: a job line that starts with the prefix
// can show up here. A Pod whose container never started has no diagnosis ("", nil).
func (b *Backend) Diagnose(ctx context.Context, h podworker.Handle) (string, error) {
	uid, err := checkHandle(h)
	if err != nil {
		return "", err
	}
	pods := b.client.CoreV1().Pods(b.ns)
	pod, err := pods.Get(ctx, h.ID, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || (err == nil && uid != "" && string(pod.UID) != uid):
		return "", fmt.Errorf("kube: diagnose %s: %w", h.ID, podworker.ErrNotFound)
	case err != nil:
		return "", fmt.Errorf("kube: diagnose %s: %w", h.ID, err)
	}
	rc, err := pods.GetLogs(h.ID, &corev1.PodLogOptions{
		Container:  ContainerName,
		TailLines:  ptr.To[int64](podworker.DiagnoseTail),
		LimitBytes: ptr.To[int64](podworker.DiagnoseMaxBytes),
	}).Stream(ctx)
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("kube: diagnose %s: %w", h.ID, podworker.ErrNotFound)
	case apierrors.IsBadRequest(err):
		return "", nil // the container is waiting to start
	case err != nil:
		return "", fmt.Errorf("kube: diagnose %s: %w", h.ID, err)
	}
	defer rc.Close()
	last, err := podworker.LastErrorLine(rc, podworker.DiagnoseMaxBytes, podworker.ExecutorErrorPrefix)
	if err != nil {
		return last, fmt.Errorf("kube: diagnose %s: %w", h.ID, err)
	}
	return last, nil
}
