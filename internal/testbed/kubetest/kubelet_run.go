package kubetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// errNotReady reports a Pod that cannot start yet (a Secret it mounts does not exist); the
// Kubelet retries it with a backoff, as the kubelet retries mounts.
var errNotReady = errors.New("not ready to start")

// podError is a Pod the Kubelet cannot run; its container stays Waiting with reason and the
// message, and the Kubelet does not retry.
type podError struct {
	reason string
	msg    string
}

func (e *podError) Error() string { return e.reason + ": " + e.msg }

func unsupported(format string, args ...any) error {
	return &podError{reason: "CreateContainerConfigError", msg: "kubetest: " + fmt.Sprintf(format, args...)}
}

// The parts of the Engine API's container create body the Kubelet sets.
type (
	createBody struct {
		Image      string            `json:"Image"`
		Entrypoint []string          `json:"Entrypoint,omitempty"`
		Cmd        []string          `json:"Cmd,omitempty"`
		Env        []string          `json:"Env"`
		WorkingDir string            `json:"WorkingDir,omitempty"`
		User       string            `json:"User,omitempty"`
		Labels     map[string]string `json:"Labels"`
		HostConfig hostConfig        `json:"HostConfig"`
	}
	hostConfig struct {
		NetworkMode    string            `json:"NetworkMode"`
		Privileged     bool              `json:"Privileged"`
		CapAdd         []string          `json:"CapAdd,omitempty"`
		CapDrop        []string          `json:"CapDrop,omitempty"`
		SecurityOpt    []string          `json:"SecurityOpt,omitempty"`
		GroupAdd       []string          `json:"GroupAdd,omitempty"`
		ReadonlyRootfs bool              `json:"ReadonlyRootfs"`
		MaskedPaths    *[]string         `json:"MaskedPaths,omitempty"`
		ReadonlyPaths  *[]string         `json:"ReadonlyPaths,omitempty"`
		Tmpfs          map[string]string `json:"Tmpfs,omitempty"`
		Binds          []string          `json:"Binds,omitempty"`
		Memory         int64             `json:"Memory,omitempty"`
		MemorySwap     int64             `json:"MemorySwap,omitempty"`
		NanoCpus       int64             `json:"NanoCpus,omitempty"`
		RestartPolicy  struct {
			Name string `json:"Name"`
		} `json:"RestartPolicy"`
	}
)

// admit runs a new Pod: it prepares its volumes, creates and starts its container and reports
// it Running, or reports why it cannot run.
func (k *Kubelet) admit(ctx context.Context, key string, pod *corev1.Pod) error {
	st := &podState{uid: pod.UID, dir: filepath.Join(k.dir, string(pod.UID)), startedAt: metav1.Now()}
	if len(pod.Spec.Containers) != 1 {
		return k.refuse(ctx, key, pod, st, unsupported("%d containers: only Pods of exactly one container (and init containers) run here",
			len(pod.Spec.Containers)))
	}
	c := pod.Spec.Containers[0]
	body, err := k.createBody(ctx, pod, c, st)
	if errors.Is(err, errNotReady) {
		removeAll(st.dir)
		return err
	}
	if err != nil {
		return k.refuse(ctx, key, pod, st, err)
	}
	if done, err := k.runInit(ctx, key, pod, st); done || err != nil {
		return err
	}
	name := strings.Join([]string{"k8s", c.Name, pod.Name, pod.Namespace, string(pod.UID), "0"}, "_")
	var created struct {
		ID string `json:"Id"`
	}
	// The create is not cancelled with the Kubelet: an aborted request may still create the
	// container after Stop listed the Kubelet's containers, leaving it behind. Finished, the
	// container is either recorded below or found by Stop.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := k.eng.call(cctx, http.MethodPost, "/containers/create", url.Values{"name": {name}}, body, &created); err != nil {
		return k.refuse(ctx, key, pod, st, &podError{reason: "CreateContainerError", msg: err.Error()})
	}
	st.containerID = created.ID
	k.mu.Lock()
	k.pods[key] = st
	k.mu.Unlock()
	if err := k.eng.call(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, nil, nil); err != nil {
		// Like a kubelet with restartPolicy Never: the container failed to start, the Pod failed.
		k.logf("kubetest: kubelet: start container of %s: %v", key, err)
	} else {
		k.setRunning(ctx, pod, st, body.Image)
	}
	if d := pod.Spec.ActiveDeadlineSeconds; d != nil {
		k.mu.Lock()
		st.timer = time.AfterFunc(time.Duration(*d)*time.Second, func() { k.deadlineExceeded(key, st) })
		k.mu.Unlock()
	}
	k.wg.Go(func() { k.waitContainer(key, pod, st, body.Image) })
	return nil
}

// refuse records a Pod that cannot run and reports it Pending with the reason.
func (k *Kubelet) refuse(ctx context.Context, key string, pod *corev1.Pod, st *podState, err error) error {
	var pe *podError
	if !errors.As(err, &pe) || ctx.Err() != nil {
		return err
	}
	k.logf("kubetest: kubelet: pod %s cannot run: %v", key, err)
	k.mu.Lock()
	k.pods[key] = st
	k.mu.Unlock()
	return k.setWaiting(ctx, pod, st, pe.reason, pe.msg)
}

// deadlineExceeded kills the container of a Pod whose activeDeadlineSeconds passed; its waiter
// then reports the Pod Failed with reason DeadlineExceeded.
func (k *Kubelet) deadlineExceeded(key string, st *podState) {
	k.mu.Lock()
	if k.pods[key] != st || st.exited {
		k.mu.Unlock()
		return
	}
	st.deadline = true
	k.mu.Unlock()
	if err := k.eng.call(k.ctx, http.MethodPost, "/containers/"+st.containerID+"/kill", nil, nil, nil); err != nil && k.ctx.Err() == nil {
		k.logf("kubetest: kubelet: kill container of %s at its deadline: %v", key, err)
	}
}

// waitContainer waits for the Pod's container to end, reports the final status and queues the
// Pod again (a deletion waiting for the container can finish then).
func (k *Kubelet) waitContainer(key string, pod *corev1.Pod, st *podState, image string) {
	var res struct {
		StatusCode int `json:"StatusCode"`
	}
	q := url.Values{"condition": {"not-running"}}
	if err := k.eng.call(k.ctx, http.MethodPost, "/containers/"+st.containerID+"/wait", q, nil, &res); err != nil {
		if k.ctx.Err() == nil && !isNotFound(err) {
			k.logf("kubetest: kubelet: wait for the container of %s: %v", key, err)
		}
		return
	}
	var c struct {
		State struct {
			ExitCode   int       `json:"ExitCode"`
			OOMKilled  bool      `json:"OOMKilled"`
			StartedAt  time.Time `json:"StartedAt"`
			FinishedAt time.Time `json:"FinishedAt"`
		} `json:"State"`
	}
	term := corev1.ContainerStateTerminated{ExitCode: int32(res.StatusCode), ContainerID: "docker://" + st.containerID}
	if err := k.eng.call(k.ctx, http.MethodGet, "/containers/"+st.containerID+"/json", nil, nil, &c); err == nil {
		term.ExitCode = int32(c.State.ExitCode)
		if !c.State.StartedAt.IsZero() && c.State.StartedAt.Year() > 1 {
			term.StartedAt = metav1.NewTime(c.State.StartedAt)
		}
		term.FinishedAt = metav1.NewTime(c.State.FinishedAt)
		if c.State.OOMKilled {
			term.Reason = "OOMKilled"
		}
	} else {
		term.FinishedAt = metav1.Now()
	}
	k.mu.Lock()
	deadline := st.deadline
	k.mu.Unlock()
	k.setTerminated(k.ctx, pod, st, image, term, deadline)
	k.mu.Lock()
	st.exited = true
	if st.timer != nil {
		st.timer.Stop()
	}
	k.mu.Unlock()
	k.queue.Add(key)
}

// createBody translates one of the Pod's containers into a container create body.
func (k *Kubelet) createBody(ctx context.Context, pod *corev1.Pod, c corev1.Container, st *podState) (*createBody, error) {
	image, err := k.resolveImage(ctx, c.Image)
	if err != nil {
		return nil, err
	}
	env, err := containerEnv(pod, c)
	if err != nil {
		return nil, err
	}
	body := &createBody{
		Image:      image,
		Entrypoint: c.Command,
		Cmd:        c.Args,
		Env:        env,
		WorkingDir: c.WorkingDir,
		Labels: map[string]string{
			labelKubelet:      k.id,
			labelPodNamespace: pod.Namespace,
			labelPodName:      pod.Name,
			labelPodUID:       string(pod.UID),
			labelContainer:    c.Name,
		},
	}
	hc := &body.HostConfig
	hc.NetworkMode = k.network
	hc.RestartPolicy.Name = "no"
	if len(c.EnvFrom) > 0 {
		return nil, unsupported("envFrom")
	}
	if err := k.mounts(ctx, pod, c, st, hc); err != nil {
		return nil, err
	}
	k.applySecurity(pod, c, body)
	if m, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		hc.Memory, hc.MemorySwap = m.Value(), m.Value()
	}
	if cpu, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		hc.NanoCpus = cpu.MilliValue() * 1e6
	}
	return body, nil
}

// resolveImage finds the engine's image for a Pod's image reference. The Kubelet never pulls:
// a reference name@sha256:<hex> names the local image whose ID is sha256:<hex> when the engine
// has no image of that exact reference (an image built here has no registry digest).
func (k *Kubelet) resolveImage(ctx context.Context, ref string) (string, error) {
	var img struct {
		ID string `json:"Id"`
	}
	err := k.eng.call(ctx, http.MethodGet, "/images/"+url.PathEscape(ref)+"/json", nil, nil, &img)
	if isNotFound(err) {
		if _, digest, ok := strings.Cut(ref, "@"); ok && imageIDRe.MatchString(digest) {
			err = k.eng.call(ctx, http.MethodGet, "/images/"+digest+"/json", nil, nil, &img)
		}
	}
	if isNotFound(err) {
		return "", &podError{reason: "ErrImageNeverPull", msg: fmt.Sprintf("kubetest: image %s is not on the Docker engine and the test kubelet never pulls", ref)}
	}
	if err != nil {
		return "", err
	}
	return img.ID, nil
}

// containerEnv returns the container's environment: values, and the field references that
// name the Pod.
func containerEnv(pod *corev1.Pod, c corev1.Container) ([]string, error) {
	env := make([]string, 0, len(c.Env))
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				return nil, unsupported("env %s: valueFrom other than fieldRef", e.Name)
			}
			var ok bool
			if v, ok = map[string]string{
				"metadata.name":           pod.Name,
				"metadata.namespace":      pod.Namespace,
				"metadata.uid":            string(pod.UID),
				"spec.nodeName":           pod.Spec.NodeName,
				"spec.serviceAccountName": pod.Spec.ServiceAccountName,
				"status.podIP":            "127.0.0.1",
				"status.hostIP":           "127.0.0.1",
			}[e.ValueFrom.FieldRef.FieldPath]; !ok {
				return nil, unsupported("env %s: fieldRef %s", e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		}
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

// mounts sets up the container's volume mounts: emptyDir as a host directory (medium Memory as
// a tmpfs of each mount's own, except in a Pod with init containers, whose containers share
// it), Secrets as files in a host directory bind-mounted read-only, CSI volumes of a configured driver and hostPath as bind
// mounts.
func (k *Kubelet) mounts(ctx context.Context, pod *corev1.Pod, c corev1.Container, st *podState, hc *hostConfig) error {
	volumes := make(map[string]corev1.Volume, len(pod.Spec.Volumes))
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	hc.Tmpfs = make(map[string]string)
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			return unsupported("volume mount %s names no volume", m.Name)
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			return unsupported("volume mount %s: subPath", m.Name)
		}
		bind := func(src string, ro bool) {
			opt := ":rw"
			if ro || m.ReadOnly {
				opt = ":ro"
			}
			hc.Binds = append(hc.Binds, src+":"+m.MountPath+opt)
		}
		switch {
		case v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory && len(pod.Spec.InitContainers) == 0:
			opts := "rw,exec,mode=0777"
			if v.EmptyDir.SizeLimit != nil {
				opts += ",size=" + strconv.FormatInt(v.EmptyDir.SizeLimit.Value(), 10)
			}
			hc.Tmpfs[m.MountPath] = opts
		case v.EmptyDir != nil:
			// A host directory, as the kubelet's: a tmpfs would do, but Docker 20.10 resets a
			// tmpfs to mode 0755 when it is the working directory.
			dir := filepath.Join(k.dir, string(pod.UID), "volumes", v.Name)
			if err := os.MkdirAll(dir, 0o777); err != nil {
				return err
			}
			if err := os.Chmod(dir, 0o777); err != nil {
				return err
			}
			bind(dir, false)
		case v.Secret != nil:
			dir, err := k.secretVolume(ctx, pod, v)
			if err != nil {
				return err
			}
			bind(dir, true)
		case v.CSI != nil:
			dir, ok := k.csi[v.CSI.Driver]
			if !ok {
				return &podError{reason: "ContainerCreating", msg: fmt.Sprintf("kubetest: MountVolume.SetUp failed for volume %q: driver name %s not found in the list of registered CSI drivers", v.Name, v.CSI.Driver)}
			}
			bind(dir, v.CSI.ReadOnly != nil && *v.CSI.ReadOnly)
		case v.HostPath != nil:
			bind(v.HostPath.Path, false)
		default:
			return unsupported("volume %s: only emptyDir, secret, csi and hostPath volumes are emulated", v.Name)
		}
	}
	st.dir = filepath.Join(k.dir, string(pod.UID))
	return nil
}

// secretVolume writes the Secret's keys as files into a host directory: plain files (no
// ..data symlinks), with the volume's modes, and with the Pod's fsGroup as group and group read
// access added, as the kubelet does.
func (k *Kubelet) secretVolume(ctx context.Context, pod *corev1.Pod, v corev1.Volume) (string, error) {
	src := v.Secret
	sec, err := k.client.CoreV1().Secrets(pod.Namespace).Get(ctx, src.SecretName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && (src.Optional == nil || !*src.Optional) {
		return "", fmt.Errorf("secret %s: %w", src.SecretName, errNotReady)
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return "", err
	}
	dir := filepath.Join(k.dir, string(pod.UID), "volumes", v.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if sec == nil {
		return dir, nil
	}
	mode := int32(0o644)
	if src.DefaultMode != nil {
		mode = *src.DefaultMode
	}
	files := make(map[string]int32)
	if len(src.Items) == 0 {
		for key := range sec.Data {
			files[key] = mode
		}
	}
	paths := make(map[string]string)
	for _, it := range src.Items {
		files[it.Key] = mode
		if it.Mode != nil {
			files[it.Key] = *it.Mode
		}
		paths[it.Key] = it.Path
	}
	fsGroup := -1
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		fsGroup = int(*sc.FSGroup)
	}
	for _, key := range slices.Sorted(maps.Keys(files)) {
		p := filepath.Join(dir, key)
		if rel, ok := paths[key]; ok {
			p = filepath.Join(dir, rel)
		}
		perm := os.FileMode(files[key]) & 0o777
		if fsGroup >= 0 {
			perm |= 0o440
		}
		if err := os.WriteFile(p, sec.Data[key], perm); err != nil {
			return "", err
		}
		if err := os.Chmod(p, perm); err != nil {
			return "", err
		}
		if fsGroup >= 0 {
			if err := os.Chown(p, -1, fsGroup); err != nil {
				return "", err
			}
		}
	}
	return dir, nil
}

// applySecurity maps the Pod's and the container's security context onto the container; see
// privilegedCaps for privileged containers on confined hosts.
func (k *Kubelet) applySecurity(pod *corev1.Pod, c corev1.Container, body *createBody) {
	hc := &body.HostConfig
	var uid, gid *int64
	if psc := pod.Spec.SecurityContext; psc != nil {
		uid, gid = psc.RunAsUser, psc.RunAsGroup
		if psc.FSGroup != nil {
			hc.GroupAdd = append(hc.GroupAdd, strconv.FormatInt(*psc.FSGroup, 10))
		}
		for _, g := range psc.SupplementalGroups {
			hc.GroupAdd = append(hc.GroupAdd, strconv.FormatInt(g, 10))
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
		if sc.Privileged != nil && *sc.Privileged {
			if k.privCaps == nil {
				hc.Privileged = true
			} else {
				none := []string{}
				hc.CapAdd = append(hc.CapAdd, k.privCaps...)
				hc.SecurityOpt = append(hc.SecurityOpt, "seccomp=unconfined", "apparmor=unconfined")
				hc.MaskedPaths, hc.ReadonlyPaths = &none, &none
			}
		}
		hc.ReadonlyRootfs = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
		if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
			hc.SecurityOpt = append(hc.SecurityOpt, "no-new-privileges:true")
		}
		if caps := sc.Capabilities; caps != nil {
			for _, c := range caps.Add {
				hc.CapAdd = append(hc.CapAdd, string(c))
			}
			for _, c := range caps.Drop {
				hc.CapDrop = append(hc.CapDrop, string(c))
			}
		}
	}
	switch {
	case uid != nil && gid != nil:
		body.User = fmt.Sprintf("%d:%d", *uid, *gid)
	case uid != nil:
		body.User = strconv.FormatInt(*uid, 10)
	}
}

func jsonString(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}
