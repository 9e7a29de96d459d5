package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dynrunner/dynrunner/identity"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
	"github.com/dynrunner/dynrunner/internal/testbed/spiretest"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/podworker/kube"
	dynrunnerv1 "github.com/dynrunner/dynrunner/proto/dynrunner/v1"
	"github.com/dynrunner/dynrunner/proto/dynrunner/v1/dynrunnerv1connect"
)

// kubeTrustDomain is the trust domain of the Kubernetes tier's SPIRE.
const kubeTrustDomain = "dynrunner.e2e"

// kubeEnv is the Kubernetes tier of one test: a real etcd and kube-apiserver, a test kubelet
// running Pods on the Docker engine and a scheduler binding them to its node, a real SPIRE
// server and agent, and `dynrunner identity` registering the job Pods with SPIRE.
type kubeEnv struct {
	cluster *kubetest.Cluster
	spire   *spiretest.SPIRE
	ns      string
	// facadeURL is the facade's address on a non-loopback host address (Pods cannot reach a
	// loopback facade; the test kubelet's containers share the host's network).
	facadeURL string
	facadeID  spiffeid.ID
	// controllerEnv configures a controller for this tier (POD_BACKEND=kubernetes).
	controllerEnv []string
	// registrarURL is the base URL of the registrar's /healthz, /readyz and /metrics.
	registrarURL string
	// image is the executor image's ID.
	image string
}

// startKube starts the tier; imageEnv goes to scripts/executor-image.sh (GITHUB_RUNNER_DIR).
func startKube(t *testing.T, imageEnv ...string) *kubeEnv {
	t.Helper()
	needDocker(t)
	image := executorImage(t, imageEnv...)
	cluster := kubetest.Start(t)
	sp := spiretest.Start(t, kubeTrustDomain)
	kl := kubetest.StartKubelet(t, cluster, kubetest.KubeletConfig{
		CSIDrivers: map[string]string{kube.SpiffeCSIDriver: sp.AgentSocketDir},
	})
	kubetest.StartScheduler(t, cluster, kl.NodeName())
	e := &kubeEnv{cluster: cluster, spire: sp, ns: cluster.Namespace(t), image: image}
	e.facadeID = workload.FacadeID(sp.TrustDomain)
	// The controller (its pod worker) and the registrar run as a user with only the Roles
	// deploy/kubernetes grants the pod workers and the registrar in the job namespace.
	cluster.BindUserRoles(t, e.ns, map[string][]rbacv1.PolicyRule{
		"dynrunner-pod-worker": kube.RBACRules(),
		"dynrunner-identity":   identity.RBACRules(),
	})

	startRegistrar(t, e)

	ip := hostAddress(t)
	addr := net.JoinHostPort(ip, fmt.Sprint(freePortOn(t, ip)))
	e.facadeURL = "https://" + addr
	e.controllerEnv = []string{
		"POD_BACKEND=kubernetes",
		"POD_NAMESPACE=" + e.ns,
		"KUBECONFIG=" + cluster.UserKubeconfig,
		// A locally built image has no registry digest; the test kubelet resolves
		// name@sha256:<image id> to the local image (it never pulls).
		"POD_EXECUTOR_IMAGE=dynrunner.e2e/executor@" + image,
		"POD_SPIFFE_CSI=true",
		"SPIFFE_ENDPOINT_SOCKET=" + sp.EndpointSocket(),
		"SPIFFE_TRUST_DOMAIN=" + kubeTrustDomain,
		"RUNNER_FACADE_LISTEN=" + addr,
		"RUNNER_FACADE_URL=" + e.facadeURL,
	}
	return e
}

// startRegistrar runs `dynrunner identity` for the test's job namespace until the test ends.
//
// Production registers Pods with IDENTITY_SELECTORS=k8s (k8s:pod-uid:<uid>): SPIRE's k8s
// workload attestor finds a workload's Pod UID in its kubepods cgroup path and confirms it
// with the node's kubelet API. The test kubelet is no kubelet SPIRE can ask, and its Docker
// containers live in the engine's cgroups, so the test uses IDENTITY_SELECTORS=docker: the
// docker workload attestor selects the io.kubernetes.pod.uid and io.kubernetes.pod.namespace
// labels the test kubelet sets on each Pod's container, as dockershim and cri-dockerd do. The
// entries are otherwise the production ones: one per Pod UID, the assignment's SPIFFE ID, a
// short SVID TTL.
func startRegistrar(t *testing.T, e *kubeEnv) {
	t.Helper()
	e.registrarURL = runRegistrar(t,
		"POD_NAMESPACE="+e.ns,
		"KUBECONFIG="+e.cluster.UserKubeconfig,
		"SPIRE_SERVER_SOCKET="+e.spire.ServerSocket,
		"SPIFFE_TRUST_DOMAIN="+kubeTrustDomain,
		"IDENTITY_PARENT_ID="+e.spire.AgentID.String(),
		"IDENTITY_SELECTORS=docker",
		// The controller's own SVID (the facade's identity) comes from the same agent, through
		// the registrar's facade entry. The selectors name the controller binary run by root;
		// a job container's processes, root too when privileged, run another path
		// (/usr/local/bin/dynrunner in the image), and their own entries select their Pod's UID.
		"IDENTITY_FACADE_SELECTORS=unix:uid:0,unix:path:"+controllerBin(t),
		"IDENTITY_SVID_TTL=5m",
		"IDENTITY_RESYNC=5s",
	)
}

// runRegistrar runs `dynrunner identity` with env (besides PATH and HTTP_LISTEN) until the
// test ends, waits until it is ready and returns the base URL of its /healthz, /readyz and
// /metrics.
func runRegistrar(t *testing.T, env ...string) string {
	t.Helper()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "identity.log")
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	defer logf.Close()
	port := freePort(t)
	cmd := exec.Command(controllerBin(t), "identity")
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), fmt.Sprintf("HTTP_LISTEN=127.0.0.1:%d", port)}, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			assert.Fail(t, "dynrunner identity did not stop within 30s of SIGTERM")
			_ = cmd.Process.Kill()
			<-done
		}
		raceCheck(t, "dynrunner identity", logPath)
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("dynrunner identity log:\n%s", tail(string(b), 60))
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	waitReady(t, "dynrunner identity", base+"/readyz", done, logPath)
	return base
}

// hostAddress returns an IPv4 address of this host that is not loopback.
func hostAddress(t *testing.T) string {
	t.Helper()
	ifaces, err := net.Interfaces()
	require.NoError(t, err)
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String()
			}
		}
	}
	t.Skip("this host has no non-loopback IPv4 address for the facade")
	return ""
}

func freePortOn(t *testing.T, ip string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// pods lists the job Pods of the namespace.
func (e *kubeEnv) pods(t *testing.T) []corev1.Pod {
	t.Helper()
	list, err := e.cluster.Client.CoreV1().Pods(e.ns).List(t.Context(), metav1.ListOptions{LabelSelector: kube.Selector})
	require.NoError(t, err)
	return list.Items
}

// podEntries returns the SPIRE entries selecting the Pod with uid.
func (e *kubeEnv) podEntries(t *testing.T, uid string) []spiretest.Entry {
	t.Helper()
	var out []spiretest.Entry
	for _, en := range e.spire.Entries(t) {
		if slices.Contains(en.Selectors, "docker:label:io.kubernetes.pod.uid:"+uid) {
			out = append(out, en)
		}
	}
	return out
}

// podContainers lists the Docker containers (running or not) of the Pod with uid.
func podContainers(t *testing.T, uid string) []string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "docker", "ps", "-aq", "--filter", "label=io.kubernetes.pod.uid="+uid).CombinedOutput()
	require.NoError(t, err, "docker ps: %v\n%s", err, out)
	return strings.Fields(string(out))
}

// runningPod waits until the namespace holds exactly one job Pod, running, and returns it.
func (e *kubeEnv) runningPod(t *testing.T) corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if pods := e.pods(t); len(pods) == 1 && pods[0].Status.Phase == corev1.PodRunning {
			return pods[0]
		} else {
			require.LessOrEqual(t, len(pods), 1, "%d job pods, want one", len(pods))
		}
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "no running job pod within 2 minutes: %v", e.pods(t))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// assertGone waits until the Pod with uid, its container and its SPIRE entry are gone.
func (e *kubeEnv) assertGone(t *testing.T, uid string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		pods, containers, entries := len(e.pods(t)), podContainers(t, uid), e.podEntries(t, uid)
		if pods == 0 && len(containers) == 0 && len(entries) == 0 {
			return
		}
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "after the job: %d job pods, containers %v, SPIRE entries %v; want none", pods, containers, entries)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// podAssignment returns the assignment a job Pod runs, from its labels.
func podAssignment(t *testing.T, p corev1.Pod) (assignment.TaskID, assignment.Epoch) {
	t.Helper()
	task, epoch, ok := kube.Assignment(&p)
	require.True(t, ok, "pod %s has no assignment labels: %v", p.Name, p.Labels)
	return task, epoch
}

const kubeWorkflow = `name: kube
on: [push]
jobs:
  pod:
    runs-on: [self-hosted, pod]
    steps:
      - name: workload api
        run: ls -l /run/spire/sockets/ && echo "SPIFFE_ENDPOINT_SOCKET=${SPIFFE_ENDPOINT_SOCKET:-unset for the job}"
      - name: work
        run: for i in $(seq 1 60); do echo "line $i"; sleep 0.1; done
      - name: secret
        run: echo "the secret is ${{ secrets.E2E_SECRET }}"
`

// TestKubeJobWithSPIRE runs a real Gitea job on [self-hosted, pod] through the kubernetes
// backend: the controller creates a Pod, `dynrunner identity` creates a SPIRE entry for its UID,
// the test kubelet runs its container on the Docker engine, the executor inside takes its SVID
// from the real SPIRE agent through the CSI-mounted Workload API and runs the job green; then
// the Pod, its container and its entry are gone.
func TestKubeJobWithSPIRE(t *testing.T) {
	tools := needTools(t)
	e := startKube(t)
	f := startForge(t, tools)
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "kube")
	require.NoError(t, err)
	require.NoError(t, f.SetSecret(ctx, repo, "E2E_SECRET", secretValue))
	c := newController(t, tools, f, repo.String(), append([]string{leaseEnv, pickupEnv}, e.controllerEnv...)...)
	c.start()

	began := time.Now()
	sha, err := f.PushWorkflow(ctx, repo, ".gitea/workflows/kube.yml", kubeWorkflow)
	require.NoError(t, err)
	pod := e.runningPod(t)
	uid := string(pod.UID)
	task, epoch := podAssignment(t, pod)
	wantID := workload.AssignmentID(e.spire.TrustDomain, task, epoch).String()
	t.Logf("pod %s (uid %s) running %s after %s", pod.Name, uid, wantID, time.Since(began).Round(100*time.Millisecond))
	if ents := e.podEntries(t, uid); assert.Len(t, ents, 1, "SPIRE entries for the pod's uid: %+v, want one for %s", ents, wantID) {
		assert.Equal(t, wantID, ents[0].SPIFFEID.String(), "SPIRE entry for the pod's uid: %+v", ents[0])
		assert.Contains(t, ents[0].Selectors, "docker:label:io.kubernetes.pod.namespace:"+e.ns, "SPIRE entry for the pod's uid: %+v", ents[0])
	}
	assert.Len(t, podContainers(t, uid), 1, "containers of the pod")
	// The executor logs the SVID it took from the Workload API.
	deadline := time.Now().Add(time.Minute)
	for {
		logs, _ := e.cluster.Client.CoreV1().Pods(e.ns).GetLogs(pod.Name, &corev1.PodLogOptions{Container: kube.ContainerName}).DoRaw(ctx)
		if strings.Contains(string(logs), "SVID received") && strings.Contains(string(logs), wantID) {
			break
		}
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "the executor did not log its SVID %s within a minute:\n%s", wantID, tail(string(logs), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}

	run := waitRun(t, f, repo, sha, 5*time.Minute)
	t.Logf("run concluded %s in %s", run.Conclusion, time.Since(began).Round(100*time.Millisecond))
	require.Len(t, run.Jobs, 1, "run: %+v", run.Jobs)
	require.EqualValues(t, "success", run.Jobs[0].Conclusion, "run: %+v", run.Jobs)
	log, err := f.JobLog(ctx, repo, run.Jobs[0].ID)
	require.NoError(t, err)
	// SPIFFE_ENDPOINT_SOCKET is the executor's setting, not the job's.
	for _, want := range []string{"agent.sock", "SPIFFE_ENDPOINT_SOCKET=unset for the job", "line 60", "the secret is ***"} {
		assert.True(t, strings.Contains(log, want), "job log lacks %q", want)
	}
	assert.False(t, strings.Contains(log, secretValue), "the job log shows the secret in clear")
	if t.Failed() {
		t.Logf("job log:\n%s", tail(devforge.NormalizeLog(log), 60))
	}
	e.assertGone(t, uid)

	// The pod worker recorded the Pod's UID and phases in the event log, as an operator reads
	// them.
	cmd := exec.Command(controllerBin(t), "events", "--json", "--follow=false")
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "dynrunner events: %v\n%s", err, out)
	var phases []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, `"kind":"environment"`) && strings.Contains(line, `"pod_uid":"`+uid+`"`) {
			if m := regexp.MustCompile(`"phase":"([A-Za-z]+)"`).FindStringSubmatch(line); m != nil {
				phases = append(phases, m[1])
			}
		}
	}
	i := slices.Index(phases, "Running")
	assert.True(t, i >= 0 && slices.Contains(phases[i:], "Succeeded"), "phases recorded for pod %s: %v, want Running then Succeeded\n%s", uid, phases, tail(string(out), 20))

	// The registrar counts the Pod's entry as created and deleted (the facade's entry is the
	// other creation).
	resp, err := http.Get(e.registrarURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	for _, want := range []string{"dynrunner_identity_entries_created_total 2", "dynrunner_identity_entries_deleted_total 1", "dynrunner_identity_ready 1"} {
		assert.Contains(t, string(metrics), want+"\n", "registrar metrics lack %q", want)
	}
}

// TestKubePodDeletedMidJob deletes a running job's Pod: the job fails in Gitea with a message
// saying the environment ended, and the Pod's container and SPIRE entry are gone. Before
// that, while the job runs, it shows the facade refusing a real SPIRE SVID of another
// assignment presenting the Pod's capability token, and the Pod's own identity used for
// another task.
func TestKubePodDeletedMidJob(t *testing.T) {
	tools := needTools(t)
	e := startKube(t)
	f := startForge(t, tools)
	ctx := t.Context()
	repo, err := f.CreateRepo(ctx, "kube-deleted")
	require.NoError(t, err)
	c := newController(t, tools, f, repo.String(), append([]string{leaseEnv, pickupEnv}, e.controllerEnv...)...)
	c.start()
	sha, err := f.PushWorkflow(ctx, repo, ".gitea/workflows/deleted.yml", `name: deleted
on: [push]
jobs:
  victim:
    runs-on: [self-hosted, pod]
    steps:
      - run: for i in $(seq 1 900); do echo "tick $i"; sleep 0.1; done
`)
	require.NoError(t, err)
	waitLogged(t, f, repo, sha, "tick 10\n", 3*time.Minute)
	pod := e.runningPod(t)
	uid := string(pod.UID)

	e.refusesForeignSVID(t, pod)
	e.refusesOwnSVIDForAnotherTask(t, pod)

	require.NoError(t, e.cluster.Client.CoreV1().Pods(e.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
	run := waitRun(t, f, repo, sha, 5*time.Minute)
	require.Len(t, run.Jobs, 1, "run after the pod was deleted: %+v", run.Jobs)
	require.EqualValues(t, "failure", run.Jobs[0].Conclusion, "run after the pod was deleted: %+v", run.Jobs)
	log, err := f.JobLog(ctx, repo, run.Jobs[0].ID)
	require.NoError(t, err)
	require.True(t, strings.Contains(log, "dynrunner: the job failed: the environment"), "the job log does not say the environment ended:\n%s", tail(log, 20))
	e.assertGone(t, uid)
}

// refusesForeignSVID takes the running Pod's capability token from its Secret and presents it
// to the facade with an SVID the real SPIRE issued for another assignment (as another job's
// Pod would hold): the facade refuses it.
func (e *kubeEnv) refusesForeignSVID(t *testing.T, pod corev1.Pod) {
	t.Helper()
	ctx := t.Context()
	task, _ := podAssignment(t, pod)
	sec, err := e.cluster.Client.CoreV1().Secrets(e.ns).Get(ctx, pod.Name, metav1.GetOptions{})
	require.NoError(t, err)
	token := string(sec.Data[podworker.TokenFile])
	require.NotEmpty(t, token, "the pod's secret holds no %s", podworker.TokenFile)
	self, err := os.Executable()
	require.NoError(t, err)
	other := workload.AssignmentID(e.spire.TrustDomain, task+1000, 1)
	en := e.spire.CreateEntry(t, other.String(), e.spire.AgentID.String(), fmt.Sprintf("unix:uid:%d", os.Getuid()), "unix:path:"+self)
	defer e.spire.DeleteEntry(t, en.ID)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	src, err := workloadapi.NewX509Source(wctx, workloadapi.WithClientOptions(workloadapi.WithAddr(e.spire.EndpointSocket())))
	require.NoError(t, err, "SVID for %s from the SPIRE agent", other)
	defer src.Close()
	svid, err := src.GetX509SVID()
	require.NoError(t, err, "the agent issued %v (%v), want %s", svid, err, other)
	require.Equal(t, other, svid.ID, "the agent issued %v (%v), want %s", svid, err, other)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: workload.ClientTLSConfig(src, e.facadeID), ForceAttemptHTTP2: true}}
	defer hc.CloseIdleConnections()
	rc := runnerv1connect.NewRunnerServiceClient(hc, e.facadeURL+"/api/actions")
	_, err = rc.Register(ctx, connect.NewRequest(&runnerv1.RegisterRequest{Name: "thief", Token: token}))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err),
		"register with pod %s's token and the SVID of %s: %v, want permission denied", pod.Name, other, err)
	t.Logf("facade refused the SVID of %s presenting pod %s's token: %v", other, pod.Name, err)
}

// refusesOwnSVIDForAnotherTask presents an SVID the real SPIRE issued for the running Pod's
// own assignment (as the Pod's executor holds) and asks the facade to renew the lease of
// another task with it: the facade refuses it.
func (e *kubeEnv) refusesOwnSVIDForAnotherTask(t *testing.T, pod corev1.Pod) {
	t.Helper()
	ctx := t.Context()
	task, epoch := podAssignment(t, pod)
	self, err := os.Executable()
	require.NoError(t, err)
	own := workload.AssignmentID(e.spire.TrustDomain, task, epoch)
	en := e.spire.CreateEntry(t, own.String(), e.spire.AgentID.String(), fmt.Sprintf("unix:uid:%d", os.Getuid()), "unix:path:"+self)
	defer e.spire.DeleteEntry(t, en.ID)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	addr := workloadapi.WithAddr(e.spire.EndpointSocket())
	src, err := workloadapi.NewX509Source(wctx, workloadapi.WithClientOptions(addr))
	require.NoError(t, err, "SVIDs from the SPIRE agent")
	defer src.Close()
	// The test process may hold other SVIDs too (refusesForeignSVID's, until the agent drops
	// it): present exactly the Pod's own.
	var svid *x509svid.SVID
	require.Eventually(t, func() bool {
		svids, err := workloadapi.FetchX509SVIDs(wctx, addr)
		if err != nil {
			return false
		}
		for _, s := range svids {
			if s.ID == own {
				svid = s
				return true
			}
		}
		return false
	}, time.Minute, 200*time.Millisecond, "the agent issued no SVID for %s", own)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: workload.ClientTLSConfig(oneSVID{src, svid}, e.facadeID), ForceAttemptHTTP2: true}}
	defer hc.CloseIdleConnections()
	lease := dynrunnerv1connect.NewLeaseServiceClient(hc, e.facadeURL)
	other := task + 1000
	_, err = lease.Renew(ctx, connect.NewRequest(&dynrunnerv1.RenewRequest{TaskId: int64(other), Epoch: uint64(epoch)}))
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err),
		"renew task %d with the SVID of pod %s's assignment %s: %v, want permission denied", other, pod.Name, own, err)
	t.Logf("facade refused pod %s's own SVID %s renewing task %d: %v", pod.Name, own, other, err)
}

// oneSVID presents one chosen SVID of a Workload API source and trusts the source's bundles.
type oneSVID struct {
	*workloadapi.X509Source
	svid *x509svid.SVID
}

func (o oneSVID) GetX509SVID() (*x509svid.SVID, error) { return o.svid, nil }

// TestKubeControllerSIGKILLMidJob: with the kubernetes backend, a controller killed mid-job and
// started again adopts the running Pod; the job finishes with its complete log, reported once,
// and the Pod, its container and its SPIRE entry are gone.
func TestKubeControllerSIGKILLMidJob(t *testing.T) {
	tools := needTools(t)
	e := startKube(t)
	var uid string
	sigkillMidJob(t, tools, startForge(t, tools), func() { uid = string(e.runningPod(t).UID) }, e.controllerEnv...)
	require.NotEmpty(t, uid, "no pod was seen running")
	e.assertGone(t, uid)
}
