package kube

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
)

const namePrefix = "dynrunner-"

// podName is the name of the Pod and of its Secret, and the Handle.ID, of an assignment's
// environment: dynrunner-<task>-<epoch>, at most 50 characters.
func podName(task assignment.TaskID, epoch assignment.Epoch) string {
	return podworker.EnvName(namePrefix, task, epoch)
}

// parseName is the inverse of podName; ok is false for any other name.
func parseName(name string) (assignment.TaskID, assignment.Epoch, bool) {
	return podworker.ParseEnvName(namePrefix, name)
}

// labels are the labels of an environment's Pod and Secret.
func labels(task assignment.TaskID, epoch assignment.Epoch) map[string]string {
	return map[string]string{
		LabelManagedBy: ManagedBy,
		LabelComponent: Component,
		LabelTask:      task.String(),
		LabelEpoch:     epoch.String(),
	}
}

// Selector is the label selector of every object (Pod, Secret) the backend creates.
const Selector = LabelManagedBy + "=" + ManagedBy + "," + LabelComponent + "=" + Component

// selector is Selector, for the package's own lists.
const selector = Selector

// managed reports whether an object carries the backend's labels.
func managed(m metav1.Object) bool {
	l := m.GetLabels()
	return l[LabelManagedBy] == ManagedBy && l[LabelComponent] == Component
}

// taskOf returns the task and epoch of a managed object: from its name, when its labels
// agree; zero otherwise (an object the worker reaps).
func taskOf(m metav1.Object) (assignment.TaskID, assignment.Epoch) {
	task, epoch, ok := parseName(m.GetName())
	l := m.GetLabels()
	if !ok || l[LabelTask] != task.String() || l[LabelEpoch] != epoch.String() {
		return 0, 0
	}
	return task, epoch
}

// Assignment returns the task and epoch of an object the backend created, read from its name
// and checked against its labels; ok is false for any other object.
func Assignment(m metav1.Object) (task assignment.TaskID, epoch assignment.Epoch, ok bool) {
	if !managed(m) {
		return 0, 0, false
	}
	task, epoch = taskOf(m)
	return task, epoch, task > 0
}

// handle is the Handle of pod.
func handle(pod *corev1.Pod) podworker.Handle {
	task, epoch := taskOf(pod)
	return podworker.Handle{
		Backend: backendName,
		ID:      pod.Name,
		Task:    task,
		Epoch:   epoch,
		Data:    map[string]string{dataPodUID: string(pod.UID)},
	}
}

// checkHandle validates h and returns the Pod UID it records ("" for a handle without one:
// an orphaned Secret, or a handle made up by the worker).
func checkHandle(h podworker.Handle) (string, error) {
	if h.Backend != backendName {
		return "", fmt.Errorf("kube: handle of backend %q: %w", h.Backend, ErrInvalidHandle)
	}
	if msgs := validation.IsDNS1123Subdomain(h.ID); len(msgs) > 0 {
		return "", fmt.Errorf("kube: handle id %q: %w", h.ID, ErrInvalidHandle)
	}
	uid, ok := h.Data[dataPodUID]
	if ok && (uid == "" || len(uid) > 128 || strings.ContainsAny(uid, "/\x00")) {
		return "", fmt.Errorf("kube: handle %s: pod uid %q: %w", h.ID, uid, ErrInvalidHandle)
	}
	return uid, nil
}

// validName reports whether name is safe as a secret file name and a Secret key: not empty,
// no separator, no "..", only the characters Secret keys allow.
func validName(name string) bool {
	return name != "" && !strings.Contains(name, "..") && len(validation.IsConfigMapKey(name)) == 0 &&
		!strings.ContainsRune(name, '/')
}

// validateSpec checks everything Start takes from outside.
func validateSpec(spec podworker.Spec) error {
	if spec.Task <= 0 || spec.Epoch == 0 {
		return fmt.Errorf("%w: task %d epoch %d", ErrInvalidSpec, spec.Task, spec.Epoch)
	}
	for k, v := range spec.Env {
		if msgs := validation.IsEnvVarName(k); len(msgs) > 0 || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%w: environment variable %q", ErrInvalidSpec, k)
		}
	}
	for name := range spec.Files {
		if !validName(name) {
			return fmt.Errorf("%w: secret file name %q", ErrInvalidSpec, name)
		}
	}
	return nil
}
