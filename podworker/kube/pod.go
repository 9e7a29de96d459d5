package kube

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/podworker"
)

// Volume names in every Pod.
const (
	volSecrets = "secrets"
	volWork    = "work"
	volHome    = "home"
	volTmp     = "tmp"
	volSpire   = "spire-agent-socket"
)

// unprivilegedID is the uid and gid of the executor image's "runner" user, which unprivileged
// Pods run as.
const unprivilegedID = 1000

// pod returns the Pod of spec's environment; its Secret has the same name.
func (b *Backend) pod(spec podworker.Spec) *corev1.Pod {
	name := podName(spec.Task, spec.Epoch)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   b.ns,
			Labels:      labels(spec.Task, spec.Epoch),
			Annotations: map[string]string{AnnotationAssignment: eventlog.Subject(spec.Task)},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			ActiveDeadlineSeconds:         ptr.To(b.deadline),
			TerminationGracePeriodSeconds: ptr.To(b.grace),
			NodeName:                      b.node,
			ServiceAccountName:            b.serviceAccount,
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			ImagePullSecrets:              b.pullSecrets(),
			SecurityContext:               b.podSecurity(),
			Containers:                    []corev1.Container{b.container(spec)},
			Volumes:                       b.volumes(name),
		},
	}
}

func (b *Backend) container(spec podworker.Spec) corev1.Container {
	inside := executor.Config{SecretsDir: SecretsDir, WorkDir: WorkDir}
	if b.spiffeCSI {
		inside.SpiffeEndpointSocket = SpiffeEndpointSocket
	}
	own := inside.BackendEnv()
	own["HOME"], own["TMPDIR"] = HomeDir, TmpDir
	env := make([]corev1.EnvVar, 0, len(spec.Env)+len(own))
	for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
		if _, mine := own[k]; !mine {
			env = append(env, corev1.EnvVar{Name: k, Value: spec.Env[k]})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(own)) {
		env = append(env, corev1.EnvVar{Name: k, Value: own[k]})
	}
	mounts := []corev1.VolumeMount{
		{Name: volSecrets, MountPath: SecretsDir, ReadOnly: true},
		{Name: volWork, MountPath: WorkDir},
		{Name: volHome, MountPath: HomeDir},
		{Name: volTmp, MountPath: TmpDir},
	}
	if b.spiffeCSI {
		mounts = append(mounts, corev1.VolumeMount{Name: volSpire, MountPath: SpireSocketDir, ReadOnly: true})
	}
	return corev1.Container{
		Name:            ContainerName,
		Image:           b.image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Env:             env,
		WorkingDir:      WorkDir,
		VolumeMounts:    mounts,
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: b.cpuReq, corev1.ResourceMemory: b.memReq},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: b.cpuLim, corev1.ResourceMemory: b.memLim},
		},
		SecurityContext:          b.containerSecurity(),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

// podSecurity is nil for privileged Pods (root, the image's user overridden by the
// container), and runs unprivileged ones as the image's runner user with fsGroup, so the
// secret files (0600, group-readable through fsGroup) are readable.
func (b *Backend) podSecurity() *corev1.PodSecurityContext {
	if b.privileged {
		return nil
	}
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To[int64](unprivilegedID),
		RunAsGroup:     ptr.To[int64](unprivilegedID),
		FSGroup:        ptr.To[int64](unprivilegedID),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

func (b *Backend) containerSecurity() *corev1.SecurityContext {
	if b.privileged {
		// The executor image's USER is the runner; a privileged job runs as root.
		return &corev1.SecurityContext{
			Privileged: ptr.To(true),
			RunAsUser:  ptr.To[int64](0),
			RunAsGroup: ptr.To[int64](0),
		}
	}
	return &corev1.SecurityContext{
		Privileged:               ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
}

func (b *Backend) volumes(secret string) []corev1.Volume {
	vs := []corev1.Volume{
		{Name: volSecrets, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: secret, DefaultMode: ptr.To[int32](0o600),
		}}},
		{Name: volWork, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: volHome, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: volTmp, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	if b.spiffeCSI {
		vs = append(vs, corev1.Volume{Name: volSpire, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: SpiffeCSIDriver, ReadOnly: ptr.To(true),
		}}})
	}
	return vs
}

func (b *Backend) pullSecrets() []corev1.LocalObjectReference {
	var refs []corev1.LocalObjectReference
	for _, s := range b.imagePullSecrets {
		refs = append(refs, corev1.LocalObjectReference{Name: s})
	}
	return refs
}

// secret returns the Secret holding spec.Files, mounted into the Pod of the same name.
func (b *Backend) secret(spec podworker.Spec) *corev1.Secret {
	data := make(map[string][]byte, len(spec.Files))
	maps.Copy(data, spec.Files)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:        podName(spec.Task, spec.Epoch),
			Namespace:   b.ns,
			Labels:      labels(spec.Task, spec.Epoch),
			Annotations: map[string]string{AnnotationAssignment: eventlog.Subject(spec.Task)},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}
