package kubetest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// DefaultNodeName is the node a Kubelet plays when KubeletConfig.NodeName is empty.
const DefaultNodeName = "kubetest-node"

// Labels on every container a Kubelet creates (the names dockershim used, plus its instance).
const (
	labelKubelet      = "kubetest.kubelet"
	labelPodNamespace = "io.kubernetes.pod.namespace"
	labelPodName      = "io.kubernetes.pod.name"
	labelPodUID       = "io.kubernetes.pod.uid"
	labelContainer    = "io.kubernetes.container.name"
)

// kubeletWorkers is how many Pods a Kubelet reconciles at once.
const kubeletWorkers = 2

var imageIDRe = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// KubeletConfig configures a Kubelet.
type KubeletConfig struct {
	// NodeName is the node the Kubelet plays (DefaultNodeName when empty). It runs the Pods
	// whose spec.nodeName is this name; no scheduler runs, so the Pods must name it.
	NodeName string
	// CSIDrivers maps CSI driver names to host directories: a Pod's CSI volume of such a driver
	// is that directory, bind-mounted (read-only when the volume says so). A volume of any other
	// driver never mounts and its Pod stays Pending, as on a node without the driver.
	CSIDrivers map[string]string
	// Network is the Docker network of the containers ("host" when empty, so they reach the
	// test's servers on loopback; the Pod IP is then reported as 127.0.0.1).
	Network string
}

// Kubelet plays the kubelet of one node for a Cluster: it registers the Node, runs the
// containers of the Pods bound to it on the Docker engine, reports their status and serves
// their logs to the apiserver. See the package documentation for what it does not emulate.
type Kubelet struct {
	client  kubernetes.Interface
	eng     *engine
	node    string
	csi     map[string]string
	network string
	dir     string
	id      string
	// privCaps are the capabilities privileged containers get instead of privileged mode on a
	// confined host (privilegedCaps); nil: they run privileged.
	privCaps []string
	logf     func(format string, args ...any)

	ctx      context.Context
	cancel   context.CancelFunc
	factory  informers.SharedInformerFactory
	store    cache.Store
	queue    workqueue.TypedRateLimitingInterface[string]
	srv      *http.Server
	wg       sync.WaitGroup
	stopOnce sync.Once

	mu   sync.Mutex
	pods map[string]*podState // by namespace/name
}

// podState is what the Kubelet knows of a Pod it admitted.
type podState struct {
	uid         types.UID
	dir         string // host directory of its secret volumes
	containerID string // empty when the container could not be created
	startedAt   metav1.Time
	stopping    bool // a graceful stop for the Pod's deletion is under way
	exited      bool // the container ended and its final status was reported
	deadline    bool // activeDeadlineSeconds passed and the container was killed
	timer       *time.Timer
}

// StartKubelet registers a Node on c and plays its kubelet until the test ends. It needs the
// Docker engine (NeedDocker).
func StartKubelet(t *testing.T, c *Cluster, cfg KubeletConfig) *Kubelet {
	t.Helper()
	NeedDocker(t)
	node := cfg.NodeName
	if node == "" {
		node = DefaultNodeName
	}
	network := cfg.Network
	if network == "" {
		network = "host"
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &Kubelet{
		client:  c.Client,
		eng:     newEngine(DockerSocket),
		node:    node,
		csi:     cfg.CSIDrivers,
		network: network,
		dir:     t.TempDir(),
		id:      randomToken()[:12],
		logf:    t.Logf,
		ctx:     ctx,
		cancel:  cancel,
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](
			200*time.Millisecond, 5*time.Second)),
		pods:     make(map[string]*podState),
		privCaps: privilegedCaps(),
	}
	if k.privCaps != nil {
		t.Logf("kubetest: kubelet: this host lacks capabilities, so the engine cannot run privileged containers: they run with the %d capabilities it has and unconfined instead", len(k.privCaps))
	}
	t.Cleanup(k.Stop)
	tlsCfg, err := c.tlsConfigFor(node)
	if err != nil {
		t.Fatalf("kubetest: kubelet certificate: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("kubetest: kubelet listener: %v", err)
	}
	k.srv = &http.Server{Handler: k.handler(), TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second}
	k.wg.Go(func() { _ = k.srv.ServeTLS(ln, "", "") })
	if err := k.registerNode(ctx, ln.Addr().(*net.TCPAddr).Port); err != nil {
		t.Fatalf("kubetest: register node %s: %v", node, err)
	}
	k.factory = informers.NewSharedInformerFactoryWithOptions(c.Client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + node }))
	inf := k.factory.Core().V1().Pods().Informer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		t.Fatalf("kubetest: kubelet informer: %v", err)
	}
	k.store = inf.GetStore()
	k.factory.Start(ctx.Done())
	syncCtx, cancelSync := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSync()
	if !cache.WaitForCacheSync(syncCtx.Done(), inf.HasSynced) {
		t.Fatal("kubetest: kubelet informer did not sync in 30s")
	}
	for range kubeletWorkers {
		k.wg.Go(k.work)
	}
	return k
}

// NodeName returns the node the Kubelet plays.
func (k *Kubelet) NodeName() string { return k.node }

// Stop stops the Kubelet and removes every container it created. Pods stay as they are. It is
// idempotent; the test's cleanup calls it.
func (k *Kubelet) Stop() {
	k.stopOnce.Do(func() {
		k.cancel()
		k.queue.ShutDown()
		if k.factory != nil {
			k.factory.Shutdown()
		}
		_ = k.srv.Close()
		k.mu.Lock()
		for _, st := range k.pods {
			if st.timer != nil {
				st.timer.Stop()
			}
		}
		k.mu.Unlock()
		k.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ids, err := k.containers(ctx, map[string]string{labelKubelet: k.id})
		if err != nil {
			k.logf("kubetest: kubelet: list containers: %v", err)
		}
		for _, id := range ids {
			if err := k.removeContainer(ctx, id); err != nil {
				k.logf("kubetest: kubelet: remove container %s: %v", id[:12], err)
			}
		}
		k.eng.close()
		removeAll(k.dir)
	})
}

// HasContainer reports whether a container of Pod namespace/name exists on the engine
// (running or not).
func (k *Kubelet) HasContainer(ctx context.Context, namespace, name string) (bool, error) {
	ids, err := k.containers(ctx, map[string]string{labelKubelet: k.id, labelPodNamespace: namespace, labelPodName: name})
	return len(ids) > 0, err
}

// work reconciles queued Pods until the queue shuts down.
func (k *Kubelet) work() {
	for {
		key, quit := k.queue.Get()
		if quit {
			return
		}
		err := k.reconcile(k.ctx, key)
		switch {
		case err == nil:
			k.queue.Forget(key)
		case k.ctx.Err() == nil:
			k.logf("kubetest: kubelet: pod %s: %v (retrying)", key, err)
			k.queue.AddRateLimited(key)
		}
		k.queue.Done(key)
	}
}

// reconcile brings the node in line with Pod key: run it, stop it for its deletion, finish the
// deletion once its container ended, or clean up after it is gone.
func (k *Kubelet) reconcile(ctx context.Context, key string) error {
	obj, exists, err := k.store.GetByKey(key)
	if err != nil {
		return err
	}
	k.mu.Lock()
	st := k.pods[key]
	k.mu.Unlock()
	var pod *corev1.Pod
	if exists {
		pod = obj.(*corev1.Pod)
	}
	if st != nil && (pod == nil || pod.UID != st.uid) {
		k.forget(ctx, key, st)
		st = nil
	}
	switch {
	case pod == nil:
		return nil
	case pod.DeletionTimestamp != nil:
		return k.terminate(ctx, key, pod, st)
	case st != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return nil
	}
	return k.admit(ctx, key, pod)
}

// terminate handles a Pod being deleted: its container gets SIGTERM and the Pod's grace
// period; once the container ended and its final status is reported (Failed, or Succeeded for a
// container that exited 0), the Pod is deleted for good.
func (k *Kubelet) terminate(ctx context.Context, key string, pod *corev1.Pod, st *podState) error {
	k.mu.Lock()
	running := st != nil && st.containerID != "" && !st.exited
	startStop := running && !st.stopping
	if startStop {
		st.stopping = true
	}
	k.mu.Unlock()
	if !running {
		return k.deletePod(ctx, pod)
	}
	if startStop {
		grace := int64(30)
		if pod.DeletionGracePeriodSeconds != nil {
			grace = *pod.DeletionGracePeriodSeconds
		}
		id := st.containerID
		k.wg.Go(func() {
			q := url.Values{"t": {fmt.Sprint(grace)}}
			err := k.eng.call(k.ctx, http.MethodPost, "/containers/"+id+"/stop", q, nil, nil)
			var ee *engineError
			if errors.As(err, &ee) && ee.status == http.StatusNotModified {
				err = nil // it had stopped already
			}
			if err != nil && k.ctx.Err() == nil {
				k.logf("kubetest: kubelet: stop container of %s: %v", key, err)
			}
		})
	}
	return nil // the container's waiter queues the Pod again once it ended
}

// deletePod removes pod from the API at once (grace 0, its UID as precondition), as the kubelet
// does once the Pod's containers are gone.
func (k *Kubelet) deletePod(ctx context.Context, pod *corev1.Pod) error {
	zero := int64(0)
	err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete: %w", err)
	}
	return nil
}

// forget removes what the Kubelet made for a Pod that is gone or was replaced.
func (k *Kubelet) forget(ctx context.Context, key string, st *podState) {
	k.mu.Lock()
	if k.pods[key] == st {
		delete(k.pods, key)
	}
	if st.timer != nil {
		st.timer.Stop()
	}
	k.mu.Unlock()
	if st.containerID != "" {
		if err := k.removeContainer(ctx, st.containerID); err != nil {
			k.logf("kubetest: kubelet: remove container of %s: %v", key, err)
		}
	}
	if st.dir != "" {
		removeAll(st.dir)
	}
}

// removeAll removes dir, also when a container left read-only directories in it (Go's module
// cache does).
func removeAll(dir string) {
	if os.RemoveAll(dir) == nil {
		return
	}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	_ = os.RemoveAll(dir)
}

// containers lists the ids of the containers (running or not) with all of labels.
func (k *Kubelet) containers(ctx context.Context, labels map[string]string) ([]string, error) {
	var filter []string
	for l, v := range labels {
		filter = append(filter, l+"="+v)
	}
	f, _ := jsonString(map[string][]string{"label": filter})
	var cs []struct {
		ID string `json:"Id"`
	}
	if err := k.eng.call(ctx, http.MethodGet, "/containers/json", url.Values{"all": {"1"}, "filters": {f}}, nil, &cs); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

func (k *Kubelet) removeContainer(ctx context.Context, id string) error {
	err := k.eng.call(ctx, http.MethodDelete, "/containers/"+id, url.Values{"force": {"1"}, "v": {"1"}}, nil, nil)
	var ee *engineError
	if isNotFound(err) || (errors.As(err, &ee) && ee.status == http.StatusConflict && strings.Contains(ee.msg, "in progress")) {
		return nil
	}
	return err
}

// registerNode creates the Node (or takes over one of that name) with a Ready condition, the
// loopback address and the port of the Kubelet's API, where the apiserver fetches logs.
func (k *Kubelet) registerNode(ctx context.Context, port int) error {
	nodes := k.client.CoreV1().Nodes()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.node, Labels: map[string]string{
		"kubernetes.io/hostname": k.node, "kubernetes.io/os": runtime.GOOS, "kubernetes.io/arch": runtime.GOARCH,
	}}}
	created, err := nodes.Create(ctx, n, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = nodes.Get(ctx, k.node, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	now := metav1.Now()
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse(fmt.Sprint(runtime.NumCPU())),
		corev1.ResourceMemory: resource.MustParse("16Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	created.Status = corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "kubetest kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
			{Type: corev1.NodeHostName, Address: k.node},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(port)}},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion: KubeVersion, OperatingSystem: runtime.GOOS, Architecture: runtime.GOARCH,
			ContainerRuntimeVersion: "docker://kubetest",
		},
	}
	_, err = nodes.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}
