package kubetest

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

const loopback = "127.0.0.1"

// updateStatus applies edit to the current status of the Pod st belongs to and writes it, retrying
// on conflicts. A Pod that is gone or was replaced is left alone.
func (k *Kubelet) updateStatus(ctx context.Context, pod *corev1.Pod, st *podState, edit func(*corev1.PodStatus)) error {
	pods := k.client.CoreV1().Pods(pod.Namespace)
	err := retry.RetryOnConflict(retry.DefaultBackoff, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case err != nil:
			return err
		case cur.UID != st.uid:
			return nil // replaced: not this Pod's status
		}
		edit(&cur.Status)
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return nil // done, or the Pod is gone
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return fmt.Errorf("update status: %w", err)
}

// setAdmitted fills what every status of an admitted Pod has.
func setAdmitted(s *corev1.PodStatus, st *podState) {
	s.HostIP, s.HostIPs = loopback, []corev1.HostIP{{IP: loopback}}
	s.PodIP, s.PodIPs = loopback, []corev1.PodIP{{IP: loopback}}
	if s.StartTime == nil {
		s.StartTime = st.startedAt.DeepCopy()
	}
}

// conditions returns the Pod conditions the kubelet keeps, with Ready and ContainersReady set
// to ready (and reason when not).
func conditions(st *podState, ready bool, reason string) []corev1.PodCondition {
	t := st.startedAt
	status := corev1.ConditionFalse
	if ready {
		status, reason = corev1.ConditionTrue, ""
	}
	now := metav1.Now()
	return []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: t},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: t},
		{Type: corev1.PodReady, Status: status, Reason: reason, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: status, Reason: reason, LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: t},
	}
}

// setRunning reports the Pod Running with its container started.
func (k *Kubelet) setRunning(ctx context.Context, pod *corev1.Pod, st *podState, imageID string) {
	c := pod.Spec.Containers[0]
	started := true
	err := k.updateStatus(ctx, pod, st, func(s *corev1.PodStatus) {
		setAdmitted(s, st)
		s.Phase = corev1.PodRunning
		s.Conditions = conditions(st, true, "")
		s.ContainerStatuses = []corev1.ContainerStatus{{
			Name: c.Name, Image: c.Image, ImageID: "docker://" + imageID,
			ContainerID: "docker://" + st.containerID, Ready: true, Started: &started,
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}},
		}}
	})
	if err != nil && ctx.Err() == nil {
		k.logf("kubetest: kubelet: pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
}

// setWaiting reports the Pod Pending with its container waiting for reason.
func (k *Kubelet) setWaiting(ctx context.Context, pod *corev1.Pod, st *podState, reason, msg string) error {
	c := pod.Spec.Containers[0]
	return k.updateStatus(ctx, pod, st, func(s *corev1.PodStatus) {
		setAdmitted(s, st)
		s.Phase = corev1.PodPending
		s.Conditions = conditions(st, false, "ContainersNotReady")
		s.ContainerStatuses = []corev1.ContainerStatus{{
			Name: c.Name, Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}},
		}}
	})
}

// setTerminated reports the Pod's final phase: Succeeded when its container exited 0 (and no
// deadline killed it), Failed otherwise.
func (k *Kubelet) setTerminated(ctx context.Context, pod *corev1.Pod, st *podState, imageID string,
	term corev1.ContainerStateTerminated, deadline bool) {
	c := pod.Spec.Containers[0]
	if term.Reason == "" {
		term.Reason = "Error"
		if term.ExitCode == 0 {
			term.Reason = "Completed"
		}
	}
	if term.StartedAt.IsZero() {
		term.StartedAt = st.startedAt
	}
	started := false
	err := k.updateStatus(ctx, pod, st, func(s *corev1.PodStatus) {
		setAdmitted(s, st)
		s.Phase = corev1.PodFailed
		if term.ExitCode == 0 && !deadline {
			s.Phase = corev1.PodSucceeded
		}
		if deadline {
			s.Reason, s.Message = "DeadlineExceeded", "Pod was active on the node longer than the specified deadline"
		}
		s.Conditions = conditions(st, false, "PodCompleted")
		s.ContainerStatuses = []corev1.ContainerStatus{{
			Name: c.Name, Image: c.Image, ImageID: "docker://" + imageID,
			ContainerID: "docker://" + st.containerID, Started: &started,
			State: corev1.ContainerState{Terminated: &term},
		}}
	})
	if err != nil && ctx.Err() == nil {
		k.logf("kubetest: kubelet: pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
}
