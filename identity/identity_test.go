package identity_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/dynrunner/dynrunner/identity"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
	"github.com/dynrunner/dynrunner/internal/testbed/spiretest"
	"github.com/dynrunner/dynrunner/podworker/docker"
	"github.com/dynrunner/dynrunner/podworker/kube"
)

const trustDomain = "identity.test"

type env struct {
	kube    kubernetes.Interface
	ns      string
	entries entryv1.EntryClient
	spire   *spiretest.SPIRE
	parent  spiffeid.ID
	// hint of the registrar under test (identity.HintFor).
	hint string
}

// newEnv starts a real kube-apiserver and a real SPIRE server (and agent). No kubelet runs:
// the registrar only reads Pod objects, whose status the tests set through the API.
func newEnv(t *testing.T) *env {
	t.Helper()
	c := kubetest.Start(t)
	sp := spiretest.Start(t, trustDomain)
	conn, err := grpc.NewClient("unix://"+sp.ServerSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ns := c.Namespace(t)
	return &env{kube: c.Client, ns: ns, entries: entryv1.NewEntryClient(conn), spire: sp, parent: sp.AgentID,
		hint: identity.HintFor(identity.SourceKubernetes, ns)}
}

func (e *env) config(t *testing.T, edit func(*identity.Config)) identity.Config {
	cfg := identity.Config{
		Kube: e.kube, Namespace: e.ns, Entries: e.entries,
		TrustDomain: spiffeid.RequireTrustDomainFromString(trustDomain), ParentID: e.parent,
		Selectors: identity.SelectorsK8s, SVIDTTL: 5 * time.Minute, Resync: time.Hour,
		Log: zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger(),
	}
	if edit != nil {
		edit(&cfg)
	}
	return cfg
}

// run starts a registrar and returns a function stopping it (also called at cleanup).
func (e *env) run(t *testing.T, cfg identity.Config) (*identity.Registrar, func()) {
	t.Helper()
	r, err := identity.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "registrar")
		case <-time.After(30 * time.Second):
			assert.Fail(t, "registrar did not stop within 30s")
		}
	}
	t.Cleanup(stop)
	poll(t, "the registrar is ready", r.Ready)
	return r, stop
}

// pod creates a job Pod as the kubernetes backend names and labels it.
func (e *env) pod(t *testing.T, task, epoch int) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("dynrunner-%d-%d", task, epoch), Namespace: e.ns,
			Labels: map[string]string{
				kube.LabelManagedBy: kube.ManagedBy, kube.LabelComponent: kube.Component,
				kube.LabelTask: fmt.Sprint(task), kube.LabelEpoch: fmt.Sprint(epoch),
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, ActiveDeadlineSeconds: ptr.To[int64](3600),
			TerminationGracePeriodSeconds: ptr.To[int64](30),
			Containers:                    []corev1.Container{{Name: "executor", Image: "example.invalid/executor@sha256:" + strings.Repeat("a", 64)}},
		},
	}
	return e.create(t, p)
}

func (e *env) create(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	out, err := e.kube.CoreV1().Pods(e.ns).Create(t.Context(), p, metav1.CreateOptions{})
	require.NoError(t, err)
	return out
}

func (e *env) deletePod(t *testing.T, name string) {
	t.Helper()
	require.NoError(t, e.kube.CoreV1().Pods(e.ns).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
}

// owned lists the entries carrying the registrar's hint, by ID.
func (e *env) owned(t *testing.T) map[string]*types.Entry {
	t.Helper()
	resp, err := e.entries.ListEntries(t.Context(), &entryv1.ListEntriesRequest{
		Filter: &entryv1.ListEntriesRequest_Filter{ByHint: wrapperspb.String(e.hint)},
	})
	require.NoError(t, err)
	out := map[string]*types.Entry{}
	for _, en := range resp.Entries {
		out[en.Id] = en
	}
	return out
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting until %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func selectorStrings(en *types.Entry) []string {
	var s []string
	for _, sel := range en.Selectors {
		s = append(s, sel.Type+":"+sel.Value)
	}
	slices.Sort(s)
	return s
}

func idOf(id *types.SPIFFEID) string { return "spiffe://" + id.TrustDomain + id.Path }

func TestRegistrar(t *testing.T) {
	e := newEnv(t)

	// Entries before the registrar starts: one of its own whose Pod is gone (stale: swept at
	// start), one of the registrar of another namespace sharing the SPIRE server (its hint:
	// never touched), and one an operator made (no hint: never touched).
	stale := &types.Entry{
		Id: "dynrunner-pod-0b0e4f8e-0000-4000-8000-000000000000", Hint: e.hint,
		SpiffeId:  &types.SPIFFEID{TrustDomain: trustDomain, Path: "/dynrunner/task/1/epoch/1"},
		ParentId:  &types.SPIFFEID{TrustDomain: trustDomain, Path: e.parent.Path()},
		Selectors: []*types.Selector{{Type: "k8s", Value: "pod-uid:0b0e4f8e-0000-4000-8000-000000000000"}},
	}
	neighbour := &types.Entry{
		Id: "dynrunner-pod-1c1e4f8e-0000-4000-8000-000000000000", Hint: identity.HintFor(identity.SourceKubernetes, "staging-jobs"),
		SpiffeId:  &types.SPIFFEID{TrustDomain: trustDomain, Path: "/dynrunner/task/2/epoch/1"},
		ParentId:  &types.SPIFFEID{TrustDomain: trustDomain, Path: e.parent.Path()},
		Selectors: []*types.Selector{{Type: "k8s", Value: "pod-uid:1c1e4f8e-0000-4000-8000-000000000000"}},
	}
	resp, err := e.entries.BatchCreateEntry(t.Context(), &entryv1.BatchCreateEntryRequest{Entries: []*types.Entry{stale, neighbour}})
	require.NoError(t, err, "create the stale and the neighbour's entries")
	require.Zero(t, resp.Results[0].Status.Code, "create the stale entry: %v", resp)
	require.Zero(t, resp.Results[1].Status.Code, "create the neighbour's entry: %v", resp)
	e.spire.CreateEntry(t, "spiffe://"+trustDomain+"/operator/made", e.parent.String(), "unix:uid:4242")

	r, stop := e.run(t, e.config(t, nil))
	assert.NotContains(t, e.owned(t), stale.Id, "the stale entry survived the start sweep")
	assert.True(t, slices.ContainsFunc(e.spire.Entries(t), func(en spiretest.Entry) bool { return en.SPIFFEID.String() == "spiffe://"+trustDomain+"/operator/made" }),
		"the registrar deleted an entry it does not own")
	assert.True(t, slices.ContainsFunc(e.spire.Entries(t), func(en spiretest.Entry) bool { return en.ID == neighbour.Id }),
		"the registrar deleted the entry of another namespace's registrar")

	t.Run("a job pod gets an entry for its uid", func(t *testing.T) {
		p := e.pod(t, 7, 3)
		id := "dynrunner-pod-" + string(p.UID)
		poll(t, "the pod's entry exists", func() bool { _, ok := e.owned(t)[id]; return ok })
		en := e.owned(t)[id]
		assert.Equal(t, "spiffe://"+trustDomain+"/dynrunner/task/7/epoch/3", idOf(en.SpiffeId), "SPIFFE ID")
		assert.Equal(t, e.parent.String(), idOf(en.ParentId), "parent %s, want %s", idOf(en.ParentId), e.parent)
		assert.Equal(t, []string{"k8s:ns:" + e.ns, "k8s:pod-uid:" + string(p.UID)}, selectorStrings(en), "selectors")
		assert.EqualValues(t, 300, en.X509SvidTtl, "X509 SVID TTL %d, want 300", en.X509SvidTtl)
		wantExpiry := p.CreationTimestamp.Add(3630*time.Second + 10*time.Minute).Unix()
		assert.Equal(t, wantExpiry, en.ExpiresAt, "expires at")

		// The Pod ends: its entry goes at once, though the Pod object stays.
		p.Status.Phase = corev1.PodSucceeded
		_, err := e.kube.CoreV1().Pods(e.ns).UpdateStatus(t.Context(), p, metav1.UpdateOptions{})
		require.NoError(t, err)
		poll(t, "the ended pod's entry is deleted", func() bool { _, ok := e.owned(t)[id]; return !ok })
		e.deletePod(t, p.Name)
	})

	t.Run("a deleted pod loses its entry", func(t *testing.T) {
		p := e.pod(t, 8, 1)
		id := "dynrunner-pod-" + string(p.UID)
		poll(t, "the pod's entry exists", func() bool { _, ok := e.owned(t)[id]; return ok })
		e.deletePod(t, p.Name)
		poll(t, "the deleted pod's entry is deleted", func() bool { _, ok := e.owned(t)[id]; return !ok })
	})

	t.Run("pods that are not job pods get none", func(t *testing.T) {
		// Labels that disagree with the name, and a Pod without the backend's labels.
		p := e.pod(t, 9, 1)
		liar := p.DeepCopy()
		liar.ObjectMeta = metav1.ObjectMeta{Name: "dynrunner-10-1", Namespace: e.ns, Labels: map[string]string{
			kube.LabelManagedBy: kube.ManagedBy, kube.LabelComponent: kube.Component, kube.LabelTask: "11", kube.LabelEpoch: "1",
		}}
		liar = e.create(t, liar)
		other := p.DeepCopy()
		other.ObjectMeta = metav1.ObjectMeta{Name: "dynrunner-12-1", Namespace: e.ns, Labels: map[string]string{kube.LabelTask: "12", kube.LabelEpoch: "1"}}
		other = e.create(t, other)
		// A GitHub slot's Pod: a job Pod of the backend, but its runner never talks to the facade.
		slot := e.pod(t, int(assignment.SlotBase)+5, 1)
		poll(t, "the job pod's entry exists", func() bool { _, ok := e.owned(t)["dynrunner-pod-"+string(p.UID)]; return ok })
		require.NoError(t, r.Reconcile(t.Context()))
		for _, q := range []*corev1.Pod{liar, other, slot} {
			assert.NotContains(t, e.owned(t), "dynrunner-pod-"+string(q.UID), "pod %s got an entry", q.Name)
			e.deletePod(t, q.Name)
		}
		e.deletePod(t, p.Name)
		poll(t, "no entries are left", func() bool { return len(e.owned(t)) == 0 })
	})

	t.Run("entries of pods that ended while the registrar was down are swept at start", func(t *testing.T) {
		p := e.pod(t, 13, 2)
		id := "dynrunner-pod-" + string(p.UID)
		poll(t, "the pod's entry exists", func() bool { _, ok := e.owned(t)[id]; return ok })
		stop()
		e.deletePod(t, p.Name)
		keep := e.pod(t, 14, 1)
		_, stop2 := e.run(t, e.config(t, nil))
		owned := e.owned(t)
		assert.NotContains(t, owned, id, "the entry of the pod deleted while the registrar was down survived its start")
		assert.Contains(t, owned, "dynrunner-pod-"+string(keep.UID), "the pod created while the registrar was down has no entry after its start")
		e.deletePod(t, keep.Name)
		poll(t, "no entries are left", func() bool { return len(e.owned(t)) == 0 })
		stop2()
	})

	t.Run("docker selectors, a node alias and the facade", func(t *testing.T) {
		alias := spiffeid.RequireFromString("spiffe://" + trustDomain + "/dynrunner/nodes")
		facadeNodes := spiffeid.RequireFromString("spiffe://" + trustDomain + "/dynrunner/facade-nodes")
		_, stop3 := e.run(t, e.config(t, func(c *identity.Config) {
			c.Selectors = identity.SelectorsDocker
			c.ParentID = alias
			c.NodeAlias = &identity.NodeAlias{Selectors: []*types.Selector{{Type: "join_token", Value: "x"}}}
			c.FacadeSelectors = []*types.Selector{{Type: "unix", Value: "uid:0"}, {Type: "unix", Value: "path:/usr/bin/dynrunner"}}
			c.FacadeParent = &identity.FacadeParent{ID: facadeNodes, Selectors: []*types.Selector{{Type: "join_token", Value: "controller-node"}}}
		}))
		defer stop3()
		fa, ok := e.owned(t)["dynrunner-facade-nodes-k8s-"+e.ns]
		require.True(t, ok, "the facade nodes' alias entry is missing")
		require.Equal(t, facadeNodes.String(), idOf(fa.SpiffeId), "facade nodes' alias entry %v: SPIFFE ID", fa)
		require.Equal(t, "spiffe://"+trustDomain+"/spire/server", idOf(fa.ParentId), "facade nodes' alias entry %v: parent", fa)
		require.Equal(t, []string{"join_token:controller-node"}, selectorStrings(fa), "facade nodes' alias entry %v: selectors", fa)
		fe, ok := e.owned(t)["dynrunner-facade-k8s-"+e.ns]
		require.True(t, ok, "the facade entry is missing")
		require.Equal(t, "spiffe://"+trustDomain+"/dynrunner/facade", idOf(fe.SpiffeId), "facade entry %v: SPIFFE ID", fe)
		require.Equal(t, facadeNodes.String(), idOf(fe.ParentId), "facade entry %v: parent", fe)
		require.Equal(t, []string{"unix:path:/usr/bin/dynrunner", "unix:uid:0"}, selectorStrings(fe), "facade entry %v: selectors", fe)
		a, ok := e.owned(t)["dynrunner-node-alias-k8s-"+e.ns]
		require.True(t, ok, "the node alias entry is missing")
		require.Equal(t, alias.String(), idOf(a.SpiffeId), "node alias entry %v: SPIFFE ID", a)
		require.Equal(t, "spiffe://"+trustDomain+"/spire/server", idOf(a.ParentId), "node alias entry %v: parent", a)
		p := e.pod(t, 15, 4)
		id := "dynrunner-pod-" + string(p.UID)
		poll(t, "the pod's entry exists", func() bool { _, ok := e.owned(t)[id]; return ok })
		en := e.owned(t)[id]
		want := []string{"docker:label:io.kubernetes.pod.namespace:" + e.ns, "docker:label:io.kubernetes.pod.uid:" + string(p.UID)}
		assert.Equal(t, want, selectorStrings(en), "entry selectors")
		assert.Equal(t, alias.String(), idOf(en.ParentId), "entry parent")
		e.deletePod(t, p.Name)
		poll(t, "the pod's entry is deleted", func() bool { _, ok := e.owned(t)[id]; return !ok })
	})
}

func TestNewRefusesHalfConfigurations(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString(trustDomain)
	good := identity.Config{
		Kube: kubernetes.New(nil), Namespace: "jobs", Entries: entryv1.NewEntryClient(nil), TrustDomain: td,
		ParentID: spiffeid.RequireFromString("spiffe://" + trustDomain + "/nodes"), Selectors: identity.SelectorsK8s, SVIDTTL: time.Minute,
	}
	_, err := identity.New(good)
	require.NoError(t, err, "a complete configuration")
	for name, edit := range map[string]func(*identity.Config){
		"no namespace":         func(c *identity.Config) { c.Namespace = "" },
		"parent in other td":   func(c *identity.Config) { c.ParentID = spiffeid.RequireFromString("spiffe://other.test/nodes") },
		"unknown selectors":    func(c *identity.Config) { c.Selectors = "unix" },
		"ttl below a minute":   func(c *identity.Config) { c.SVIDTTL = 30 * time.Second },
		"alias sans selectors": func(c *identity.Config) { c.NodeAlias = &identity.NodeAlias{} },
		"no entry client":      func(c *identity.Config) { c.Entries = nil },
		"facade parent sans facade entry": func(c *identity.Config) {
			c.FacadeParent = &identity.FacadeParent{ID: spiffeid.RequireFromString("spiffe://" + trustDomain + "/fn"), Selectors: []*types.Selector{{Type: "a", Value: "b"}}}
		},
		"unknown source":     func(c *identity.Config) { c.Source = "nomad" },
		"docker sans lister": func(c *identity.Config) { c.Source = identity.SourceDocker },
	} {
		c := good
		edit(&c)
		_, err := identity.New(c)
		assert.ErrorIs(t, err, identity.ErrConfig, name)
	}
	// The docker source needs neither a Kubernetes client nor a namespace.
	inv, err := docker.NewInventory("", "")
	require.NoError(t, err)
	dc := good
	dc.Source, dc.Docker, dc.Kube, dc.Namespace, dc.Selectors = identity.SourceDocker, inv, nil, "", ""
	_, err = identity.New(dc)
	assert.NoError(t, err, "a docker configuration")
}
