package kubetest

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// runInit runs the Pod's init containers one after the other, each to its end, before its
// container; each is removed once it ended. When one fails (or cannot be created or started),
// the Pod is reported Failed, as a kubelet does with restartPolicy Never, and done is true:
// its container never runs. The Pod stays Pending while they run.
func (k *Kubelet) runInit(ctx context.Context, key string, pod *corev1.Pod, st *podState) (done bool, err error) {
	var statuses []corev1.ContainerStatus
	for i, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil {
			return true, k.refuse(ctx, key, pod, st, unsupported("init container %s: sidecar (restartPolicy)", c.Name))
		}
		body, err := k.createBody(ctx, pod, c, st)
		if err != nil {
			return true, k.refuse(ctx, key, pod, st, err)
		}
		term, err := k.runToEnd(ctx, pod, c, i, body)
		if err != nil {
			if ctx.Err() != nil {
				return true, ctx.Err()
			}
			k.logf("kubetest: kubelet: init container %s of %s: %v", c.Name, key, err)
			term = corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(), FinishedAt: metav1.Now()}
		}
		if term.Reason == "" {
			term.Reason = "Completed"
			if term.ExitCode != 0 {
				term.Reason = "Error"
			}
		}
		statuses = append(statuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "docker://" + body.Image,
			State: corev1.ContainerState{Terminated: &term},
		})
		if term.ExitCode != 0 {
			k.setInitFailed(ctx, pod, st, statuses)
			k.mu.Lock()
			st.exited = true
			k.pods[key] = st
			k.mu.Unlock()
			return true, nil
		}
	}
	return false, nil
}

// runToEnd creates, starts and waits for one init container, and removes it.
func (k *Kubelet) runToEnd(ctx context.Context, pod *corev1.Pod, c corev1.Container, i int, body *createBody) (corev1.ContainerStateTerminated, error) {
	name := strings.Join([]string{"k8s", c.Name, pod.Name, pod.Namespace, string(pod.UID), fmt.Sprint("init", i)}, "_")
	var created struct {
		ID string `json:"Id"`
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := k.eng.call(cctx, http.MethodPost, "/containers/create", url.Values{"name": {name}}, body, &created); err != nil {
		return corev1.ContainerStateTerminated{}, err
	}
	defer func() {
		if err := k.removeContainer(cctx, created.ID); err != nil {
			k.logf("kubetest: kubelet: remove init container %s: %v", name, err)
		}
	}()
	started := metav1.Now()
	if err := k.eng.call(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, nil, nil); err != nil {
		return corev1.ContainerStateTerminated{}, err
	}
	var res struct {
		StatusCode int `json:"StatusCode"`
	}
	if err := k.eng.call(ctx, http.MethodPost, "/containers/"+created.ID+"/wait", url.Values{"condition": {"not-running"}}, nil, &res); err != nil {
		return corev1.ContainerStateTerminated{}, err
	}
	return corev1.ContainerStateTerminated{ExitCode: int32(res.StatusCode), ContainerID: "docker://" + created.ID,
		StartedAt: started, FinishedAt: metav1.Now()}, nil
}

// setInitFailed reports the Pod Failed by an init container: its container never started.
func (k *Kubelet) setInitFailed(ctx context.Context, pod *corev1.Pod, st *podState, init []corev1.ContainerStatus) {
	c := pod.Spec.Containers[0]
	err := k.updateStatus(ctx, pod, st, func(s *corev1.PodStatus) {
		setAdmitted(s, st)
		s.Phase = corev1.PodFailed
		s.Conditions = conditions(st, false, "PodCompleted")
		s.InitContainerStatuses = init
		s.ContainerStatuses = []corev1.ContainerStatus{{
			Name: c.Name, Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}},
		}}
	})
	if err != nil && ctx.Err() == nil {
		k.logf("kubetest: kubelet: pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
}
