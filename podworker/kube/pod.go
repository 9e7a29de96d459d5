package kube

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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
	// volSlotSecrets is a GitHub slot's secrets directory: a memory-backed emptyDir the init
	// container fills from the Secret, writable so the executor removes the JIT configuration.
	volSlotSecrets = "slot-secrets"
)

// slotSecretsLimit bounds a slot's memory-backed secrets directory (the JIT configuration is
// a few kilobytes).
var slotSecretsLimit = resource.MustParse("1Mi")

// unprivilegedID is the uid and gid of the executor image's "runner" user, which unprivileged
// Pods run as.
const unprivilegedID = 1000

// pod returns the Pod of spec's environment; its Secret has the same name.
func (b *Backend) pod(spec podworker.Spec) *corev1.Pod {
	name := podName(spec.Task, spec.Epoch)
	slot := spec.GitHubSlot()
	var init []corev1.Container
	if slot && len(spec.Files) > 0 {
		init = []corev1.Container{b.copySecrets(spec)}
	}
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
			InitContainers:                init,
			Containers:                    []corev1.Container{b.container(spec)},
			Volumes:                       b.volumes(name, slot),
		},
	}
}

// copySecrets is a GitHub slot's init container: it alone mounts the Secret, and copies its
// files into the slot's secrets directory (volSlotSecrets) with the executor image's cp. It
// runs with the executor's user (root in a privileged Pod, with no capability: the files
// are its own), never privileged, and with the executor's resources, which the Pod's
// requests do not add to.
func (b *Backend) copySecrets(spec podworker.Spec) corev1.Container {
	args := []string{"-L", "--"}
	for _, name := range slices.Sorted(maps.Keys(spec.Files)) {
		args = append(args, SecretsSourceDir+"/"+name)
	}
	args = append(args, SecretsDir+"/")
	sc := &corev1.SecurityContext{
		Privileged:               ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	if b.privileged {
		// The Secret's files are root's (mode 0600) in a privileged Pod, whose executor runs
		// as root; the image's USER is the runner.
		sc.RunAsUser, sc.RunAsGroup = ptr.To[int64](0), ptr.To[int64](0)
	}
	return corev1.Container{
		Name:            InitContainerName,
		Image:           b.image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{CopyCommand},
		Args:            args,
		VolumeMounts: []corev1.VolumeMount{
			{Name: volSecrets, MountPath: SecretsSourceDir, ReadOnly: true},
			{Name: volSlotSecrets, MountPath: SecretsDir},
		},
		Resources:                b.resources(),
		SecurityContext:          sc,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

func (b *Backend) resources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: b.cpuReq, corev1.ResourceMemory: b.memReq},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: b.cpuLim, corev1.ResourceMemory: b.memLim},
	}
}

func (b *Backend) container(spec podworker.Spec) corev1.Container {
	slot := spec.GitHubSlot()
	spire := b.spiffeCSI && !slot
	inside := executor.Config{SecretsDir: SecretsDir, WorkDir: WorkDir}
	if spire {
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
	secrets := corev1.VolumeMount{Name: volSecrets, MountPath: SecretsDir, ReadOnly: true}
	if slot {
		secrets = corev1.VolumeMount{Name: volSlotSecrets, MountPath: SecretsDir}
	}
	mounts := []corev1.VolumeMount{
		secrets,
		{Name: volWork, MountPath: WorkDir},
		{Name: volHome, MountPath: HomeDir},
		{Name: volTmp, MountPath: TmpDir},
	}
	if spire {
		mounts = append(mounts, corev1.VolumeMount{Name: volSpire, MountPath: SpireSocketDir, ReadOnly: true})
	}
	return corev1.Container{
		Name:                     ContainerName,
		Image:                    b.image,
		ImagePullPolicy:          corev1.PullIfNotPresent,
		Env:                      env,
		WorkingDir:               WorkDir,
		VolumeMounts:             mounts,
		Resources:                b.resources(),
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

// volumes are the Pod's volumes; a GitHub slot's add its secrets directory and leave out the
// SPIFFE CSI volume.
func (b *Backend) volumes(secret string, slot bool) []corev1.Volume {
	vs := []corev1.Volume{
		{Name: volSecrets, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: secret, DefaultMode: ptr.To[int32](0o600),
		}}},
		{Name: volWork, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: volHome, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: volTmp, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	if slot {
		vs = append(vs, corev1.Volume{Name: volSlotSecrets, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			Medium: corev1.StorageMediumMemory, SizeLimit: &slotSecretsLimit,
		}}})
	}
	if b.spiffeCSI && !slot {
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
