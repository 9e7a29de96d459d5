// Package identity is dynrunner's SPIRE registrar for job Pods and job containers
// (`dynrunner identity`).
//
// It watches the Pods the kubernetes pod backend creates and keeps one SPIRE registration
// entry per live Pod: the entry's selectors name that Pod's UID (and namespace), and its SPIFFE
// ID is the identity of the assignment the Pod's labels name,
// spiffe://<trust domain>/dynrunner/task/<id>/epoch/<epoch>. So SPIRE issues an assignment's
// SVID only to the one Pod the pod worker created for it, and only while that Pod runs. An
// entry is deleted as soon as its Pod ends (phase Succeeded or Failed), is being deleted, or
// is gone; entries whose Pods vanished while the registrar was down are swept at start.
//
// The registrar is level-triggered: every reconciliation compares all Pods in its informer
// cache with all entries carrying its hint, creates what is missing and deletes what is not
// wanted. Entry IDs are derived from Pod UIDs, so creations are idempotent across restarts
// and replicas. It talks to the SPIRE server's Entry API over the server's local admin
// socket, and holds no forge token, OpenSandbox key or other credential.
//
// With SourceDocker the environments are instead the docker pod backend's containers on the
// local Docker engine: one entry per running container of the backend's scope, selected by
// the container labels SPIRE's docker workload attestor reports (see docker.go).
package identity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	entryv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/entry/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker/kube"
)

// Hint begins the hint that marks the registration entries a registrar owns; the rest names
// its environments (HintFor), so registrars of different namespaces or Docker scopes can share
// one SPIRE server. A registrar never touches an entry without its own hint.
const Hint = "dynrunner-identity"

// HintFor is the hint of a registrar of source over namespace (SourceKubernetes) or Docker
// scope (SourceDocker): dynrunner-identity-k8s-<namespace> or dynrunner-identity-docker-<scope>.
func HintFor(source Source, namespaceOrScope string) string {
	return Hint + "-" + ownerOf(source, namespaceOrScope)
}

func ownerOf(source Source, namespaceOrScope string) string {
	if source == SourceDocker {
		return "docker-" + namespaceOrScope
	}
	return "k8s-" + namespaceOrScope
}

// entryIDPrefix begins the ID of a Pod's entry; the rest is the Pod's UID.
const entryIDPrefix = "dynrunner-pod-"

// nodeAliasEntryID begins the ID of the node alias entry (Config.NodeAlias); the registrar's
// owner (ownerOf) ends it.
const nodeAliasEntryID = "dynrunner-node-alias-"

// facadeEntryID begins the ID of the facade's entry (Config.FacadeSelectors), as
// nodeAliasEntryID.
const facadeEntryID = "dynrunner-facade-"

// facadeAliasEntryID begins the ID of the facade nodes' alias entry (Config.FacadeParent), as
// nodeAliasEntryID.
const facadeAliasEntryID = "dynrunner-facade-nodes-"

// expiryMargin is added to a Pod's active deadline for its entry's expiry, a backstop in
// case the registrar is down when the Pod ends.
const expiryMargin = 10 * time.Minute

// batchSize bounds the entries of one BatchCreate or BatchDelete call.
const batchSize = 200

// Selectors names how an entry's selectors name its Pod.
type Selectors string

const (
	// SelectorsK8s is production: SPIRE's k8s workload attestor, selectors
	// k8s:pod-uid:<uid> and k8s:ns:<namespace>.
	SelectorsK8s Selectors = "k8s"
	// SelectorsDocker is for nodes whose containers run on a Docker engine without a kubelet
	// SPIRE can ask (the integration tests' node agent): SPIRE's docker workload attestor,
	// selecting the Pod UID and namespace labels dockershim and cri-dockerd put on every
	// container, docker:label:io.kubernetes.pod.uid:<uid> and
	// docker:label:io.kubernetes.pod.namespace:<namespace>.
	SelectorsDocker Selectors = "docker"
)

// Errors of New.
var ErrConfig = errors.New("identity: invalid configuration")

// NodeAlias is a node alias entry the registrar keeps: every agent whose node selectors
// match becomes the parent of the Pod entries (Config.ParentID is its SPIFFE ID).
type NodeAlias struct {
	Selectors []*types.Selector
}

// Source names where the registrar finds the job environments.
type Source string

const (
	// SourceKubernetes is the kubernetes pod backend's Pods (Config.Kube, Config.Namespace).
	SourceKubernetes Source = "kubernetes"
	// SourceDocker is the docker pod backend's containers (Config.Docker).
	SourceDocker Source = "docker"
)

// FacadeParent is the node alias of the nodes the facade runs on.
type FacadeParent struct {
	ID        spiffeid.ID
	Selectors []*types.Selector
}

// Config configures a Registrar.
type Config struct {
	// Source of the environments; zero: SourceKubernetes.
	Source Source
	// Kube and Namespace are the Pods of SourceKubernetes.
	Kube      kubernetes.Interface
	Namespace string // of the job Pods
	// Docker lists the containers of SourceDocker.
	Docker  Containers
	Entries entryv1.EntryClient
	// TrustDomain of the assignment identities.
	TrustDomain spiffeid.TrustDomain
	// ParentID of every Pod entry: the SPIRE agent (or node alias) of the job nodes.
	ParentID spiffeid.ID
	// NodeAlias, when set, is kept as the entry ParentID (parent: the SPIRE server).
	NodeAlias *NodeAlias
	// FacadeSelectors, when set, select the controller workloads that get the facade's
	// identity (FacadeID, parent ParentID), kept like the Pod entries.
	FacadeSelectors []*types.Selector
	// FacadeID is the facade's SPIFFE ID; zero: workload.FacadeID of the trust domain.
	FacadeID spiffeid.ID
	// FacadeParent, when set, is a node alias (ID, parent the SPIRE server) that the facade's
	// entry is parented to instead of ParentID: only the agents of the controller's nodes, so
	// that the agent of a node running job Pods cannot be made to serve the facade's SVID.
	FacadeParent *FacadeParent
	// Selectors says how SourceKubernetes entries select their Pod.
	Selectors Selectors
	// SVIDTTL is the X509-SVID lifetime of Pod entries; agents rotate before it ends.
	SVIDTTL time.Duration
	// Resync is the interval of full reconciliations besides those Pod (or container) events
	// trigger.
	Resync time.Duration
	Log    zerolog.Logger
}

// Registrar keeps SPIRE entries in step with the job Pods.
type Registrar struct {
	cfg     Config
	owner   string // ownerOf its source and namespace or scope
	hint    string // HintFor its source and namespace or scope
	pods    listersv1.PodLister
	factory informers.SharedInformerFactory
	kick    chan struct{}
	ready   atomic.Bool
	created atomic.Int64
	deleted atomic.Int64
}

// New validates cfg and returns a Registrar; Run starts it.
func New(cfg Config) (*Registrar, error) {
	if cfg.Source == "" {
		cfg.Source = SourceKubernetes
	}
	switch {
	case cfg.Entries == nil:
		return nil, fmt.Errorf("%w: a SPIRE Entry API client is required", ErrConfig)
	case cfg.Source != SourceKubernetes && cfg.Source != SourceDocker:
		return nil, fmt.Errorf("%w: source %q: want kubernetes or docker", ErrConfig, cfg.Source)
	case cfg.Source == SourceDocker && cfg.Docker == nil:
		return nil, fmt.Errorf("%w: the docker source needs a container lister", ErrConfig)
	case cfg.Source == SourceKubernetes && cfg.Kube == nil:
		return nil, fmt.Errorf("%w: a Kubernetes client and a SPIRE Entry API client are required", ErrConfig)
	case cfg.Source == SourceKubernetes && cfg.Namespace == "":
		return nil, fmt.Errorf("%w: the job namespace is required", ErrConfig)
	case cfg.TrustDomain.IsZero():
		return nil, fmt.Errorf("%w: the trust domain is required", ErrConfig)
	case cfg.ParentID.IsZero() || !cfg.ParentID.MemberOf(cfg.TrustDomain):
		return nil, fmt.Errorf("%w: parent ID %q is not in trust domain %s", ErrConfig, cfg.ParentID, cfg.TrustDomain)
	case cfg.Source == SourceKubernetes && cfg.Selectors != SelectorsK8s && cfg.Selectors != SelectorsDocker:
		return nil, fmt.Errorf("%w: selectors %q: want k8s or docker", ErrConfig, cfg.Selectors)
	case cfg.SVIDTTL < time.Minute:
		return nil, fmt.Errorf("%w: SVID TTL %s is below one minute", ErrConfig, cfg.SVIDTTL)
	case cfg.NodeAlias != nil && len(cfg.NodeAlias.Selectors) == 0:
		return nil, fmt.Errorf("%w: a node alias needs selectors", ErrConfig)
	}
	if p := cfg.FacadeParent; p != nil && (p.ID.IsZero() || !p.ID.MemberOf(cfg.TrustDomain) || len(p.Selectors) == 0 || len(cfg.FacadeSelectors) == 0) {
		return nil, fmt.Errorf("%w: a facade parent needs an ID in trust domain %s, node selectors, and facade selectors", ErrConfig, cfg.TrustDomain)
	}
	if cfg.FacadeID.IsZero() {
		cfg.FacadeID = workload.FacadeID(cfg.TrustDomain)
	} else if !cfg.FacadeID.MemberOf(cfg.TrustDomain) {
		return nil, fmt.Errorf("%w: facade ID %q is not in trust domain %s", ErrConfig, cfg.FacadeID, cfg.TrustDomain)
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.Source == SourceDocker {
		owner := ownerOf(SourceDocker, cfg.Docker.Scope())
		return &Registrar{cfg: cfg, owner: owner, hint: Hint + "-" + owner, kick: make(chan struct{}, 1)}, nil
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Kube, cfg.Resync,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = kube.Selector }))
	owner := ownerOf(SourceKubernetes, cfg.Namespace)
	r := &Registrar{cfg: cfg, owner: owner, hint: Hint + "-" + owner, factory: factory, kick: make(chan struct{}, 1)}
	inf := factory.Core().V1().Pods()
	r.pods = inf.Lister()
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.trigger() },
		UpdateFunc: func(_, _ any) { r.trigger() },
		DeleteFunc: func(any) { r.trigger() },
	}); err != nil {
		return nil, fmt.Errorf("identity: watch pods: %w", err)
	}
	return r, nil
}

// Ready reports whether a reconciliation (the start sweep included) has succeeded.
func (r *Registrar) Ready() bool { return r.ready.Load() }

// Stats returns how many entries the registrar created and deleted since it started.
func (r *Registrar) Stats() (created, deleted int64) { return r.created.Load(), r.deleted.Load() }

func (r *Registrar) trigger() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run watches the Pods (or containers) and reconciles until ctx ends. Failed
// reconciliations are retried with backoff (1 s doubling to the resync interval).
func (r *Registrar) Run(ctx context.Context) error {
	if r.cfg.Source == SourceDocker {
		ctx, cancel := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			r.watchContainers(ctx)
		}()
		defer func() { cancel(); <-watched }()
		r.cfg.Log.Info().Str("scope", r.cfg.Docker.Scope()).Str("parent_id", r.cfg.ParentID.String()).
			Msg("identity registrar watching job containers")
		return r.loop(ctx)
	}
	r.factory.Start(ctx.Done())
	defer r.factory.Shutdown()
	if ok := cache.WaitForCacheSync(ctx.Done(), r.factory.Core().V1().Pods().Informer().HasSynced); !ok {
		return fmt.Errorf("identity: pod cache of namespace %s never synced: %w", r.cfg.Namespace, ctx.Err())
	}
	r.cfg.Log.Info().Str("namespace", r.cfg.Namespace).Str("parent_id", r.cfg.ParentID.String()).
		Str("selectors", string(r.cfg.Selectors)).Msg("identity registrar watching job pods")
	return r.loop(ctx)
}

// loop reconciles on every trigger and resync until ctx ends.
func (r *Registrar) loop(ctx context.Context) error {
	resync := time.NewTicker(r.cfg.Resync)
	defer resync.Stop()
	backoff := time.Duration(0)
	var retry <-chan time.Time
	r.trigger()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-resync.C:
		case <-retry:
		}
		retry = nil
		if err := r.Reconcile(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			backoff = min(max(2*backoff, time.Second), r.cfg.Resync)
			r.cfg.Log.Warn().Err(err).Dur("retry_in", backoff).Msg("reconcile spire entries")
			retry = time.After(backoff)
			continue
		}
		backoff = 0
		r.ready.Store(true)
	}
}

// Reconcile makes the registrar's entries those the cached Pods (or the running containers)
// want: it creates the missing ones and deletes the rest (including those that differ, which
// are recreated).
func (r *Registrar) Reconcile(ctx context.Context) error {
	var want map[string]*types.Entry
	var err error
	if r.cfg.Source == SourceDocker {
		want, err = r.containerEntries(ctx)
	} else {
		want, err = r.podEntries()
	}
	if err != nil {
		return err
	}
	add := func(e *types.Entry) { want[e.Id] = e }
	if r.cfg.NodeAlias != nil {
		add(r.aliasEntry(nodeAliasEntryID+r.owner, r.cfg.ParentID, r.cfg.NodeAlias.Selectors))
	}
	if len(r.cfg.FacadeSelectors) > 0 {
		parent := r.cfg.ParentID
		if p := r.cfg.FacadeParent; p != nil {
			parent = p.ID
			add(r.aliasEntry(facadeAliasEntryID+r.owner, p.ID, p.Selectors))
		}
		add(r.workloadEntry(facadeEntryID+r.owner, r.cfg.FacadeID, parent, r.cfg.FacadeSelectors))
	}
	have, err := r.ownEntries(ctx)
	if err != nil {
		return err
	}
	var drop []string
	for id, e := range have {
		if w, ok := want[id]; !ok || !sameEntry(w, e) {
			drop = append(drop, id)
		}
	}
	var missing []*types.Entry
	for id, w := range want {
		if e, ok := have[id]; !ok || !sameEntry(w, e) {
			missing = append(missing, w)
		}
	}
	slices.Sort(drop)
	slices.SortFunc(missing, func(a, b *types.Entry) int { return strings.Compare(a.Id, b.Id) })
	// An entry that cannot be deleted does not hold up the creation of the others (new
	// environments would wait for their SVIDs); the errors are reported together.
	return errors.Join(r.delete(ctx, drop, have), r.create(ctx, missing))
}

// podEntries returns the entries the cached Pods want, by ID.
func (r *Registrar) podEntries() (map[string]*types.Entry, error) {
	pods, err := r.pods.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("identity: list cached pods: %w", err)
	}
	want := make(map[string]*types.Entry, len(pods)+2)
	for _, p := range pods {
		if e := r.entryFor(p); e != nil {
			want[e.Id] = e
		}
	}
	return want, nil
}

// entryFor returns the entry pod wants, or nil when it wants none: not a job Pod of the
// backend, a GitHub slot's (its runner talks to GitHub, never to the facade, and its Pod
// mounts no Workload API; a privileged one could still reach its node's agent), not yet
// created (no UID), ended or being deleted.
func (r *Registrar) entryFor(p *corev1.Pod) *types.Entry {
	task, epoch, ok := kube.Assignment(p)
	if !ok || task.Slot() || p.UID == "" || p.DeletionTimestamp != nil ||
		p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return nil
	}
	id := workload.AssignmentID(r.cfg.TrustDomain, task, epoch)
	if id.IsZero() {
		return nil
	}
	uid, ns := string(p.UID), p.Namespace
	var sel []*types.Selector
	switch r.cfg.Selectors {
	case SelectorsDocker:
		sel = []*types.Selector{
			{Type: "docker", Value: "label:io.kubernetes.pod.namespace:" + ns},
			{Type: "docker", Value: "label:io.kubernetes.pod.uid:" + uid},
		}
	default:
		sel = []*types.Selector{
			{Type: "k8s", Value: "ns:" + ns},
			{Type: "k8s", Value: "pod-uid:" + uid},
		}
	}
	e := r.workloadEntry(entryIDPrefix+uid, id, r.cfg.ParentID, sel)
	if d := p.Spec.ActiveDeadlineSeconds; d != nil && *d > 0 && !p.CreationTimestamp.IsZero() {
		grace := int64(0)
		if g := p.Spec.TerminationGracePeriodSeconds; g != nil {
			grace = *g
		}
		e.ExpiresAt = p.CreationTimestamp.Add(time.Duration(*d+grace)*time.Second + expiryMargin).Unix()
	}
	return e
}

// workloadEntry is an entry of the registrar's giving the workloads sel selects the SVID of
// spiffeID, for the SVID TTL.
func (r *Registrar) workloadEntry(id string, spiffeID, parent spiffeid.ID, sel []*types.Selector) *types.Entry {
	return &types.Entry{
		Id: id, SpiffeId: protoID(spiffeID), ParentId: protoID(parent), Selectors: sortedSelectors(sel),
		X509SvidTtl: int32(r.cfg.SVIDTTL / time.Second), Hint: r.hint,
	}
}

// aliasEntry is a node alias entry of the registrar's: every agent whose node selectors match
// sel is spiffeID too (parent: the SPIRE server).
func (r *Registrar) aliasEntry(id string, spiffeID spiffeid.ID, sel []*types.Selector) *types.Entry {
	return &types.Entry{
		Id: id, SpiffeId: protoID(spiffeID), ParentId: protoID(spiffeid.RequireFromSegments(r.cfg.TrustDomain, "spire", "server")),
		Selectors: sortedSelectors(sel), Hint: r.hint,
	}
}

// ownEntries lists every entry carrying the registrar's hint, by ID.
func (r *Registrar) ownEntries(ctx context.Context) (map[string]*types.Entry, error) {
	have := map[string]*types.Entry{}
	req := &entryv1.ListEntriesRequest{
		Filter:   &entryv1.ListEntriesRequest_Filter{ByHint: wrapperspb.String(r.hint)},
		PageSize: 500,
	}
	for {
		resp, err := r.cfg.Entries.ListEntries(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("identity: list spire entries: %w", err)
		}
		for _, e := range resp.Entries {
			if e.Hint == r.hint { // the filter, checked
				have[e.Id] = e
			}
		}
		if resp.NextPageToken == "" {
			return have, nil
		}
		req.PageToken = resp.NextPageToken
	}
}

func (r *Registrar) create(ctx context.Context, add []*types.Entry) error {
	for chunk := range slices.Chunk(add, batchSize) {
		resp, err := r.cfg.Entries.BatchCreateEntry(ctx, &entryv1.BatchCreateEntryRequest{Entries: chunk})
		if err != nil {
			return fmt.Errorf("identity: create %d spire entries: %w", len(chunk), err)
		}
		var errs []error
		for i, res := range resp.Results {
			e := chunk[min(i, len(chunk)-1)]
			switch code := codes.Code(res.GetStatus().GetCode()); code {
			case codes.OK:
				r.created.Add(1)
				r.logEntry(zerolog.InfoLevel, "spire entry created", e)
			case codes.AlreadyExists:
				// Another replica, or an earlier call whose answer was lost.
			default:
				errs = append(errs, fmt.Errorf("entry %s (%s): %s: %s", e.Id, idString(e.SpiffeId), code, res.GetStatus().GetMessage()))
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("identity: create spire entries: %w", errors.Join(errs...))
		}
	}
	return nil
}

func (r *Registrar) delete(ctx context.Context, ids []string, have map[string]*types.Entry) error {
	for chunk := range slices.Chunk(ids, batchSize) {
		resp, err := r.cfg.Entries.BatchDeleteEntry(ctx, &entryv1.BatchDeleteEntryRequest{Ids: chunk})
		if err != nil {
			return fmt.Errorf("identity: delete %d spire entries: %w", len(chunk), err)
		}
		var errs []error
		for _, res := range resp.Results {
			switch code := codes.Code(res.GetStatus().GetCode()); code {
			case codes.OK:
				r.deleted.Add(1)
				r.logEntry(zerolog.InfoLevel, "spire entry deleted", have[res.Id])
			case codes.NotFound:
			default:
				errs = append(errs, fmt.Errorf("entry %s: %s: %s", res.Id, code, res.GetStatus().GetMessage()))
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("identity: delete spire entries: %w", errors.Join(errs...))
		}
	}
	return nil
}

func (r *Registrar) logEntry(level zerolog.Level, msg string, e *types.Entry) {
	if e == nil {
		return
	}
	ev := r.cfg.Log.WithLevel(level).Str("entry_id", e.Id).Str(logkey.SpiffeID, idString(e.SpiffeId))
	if uid, ok := strings.CutPrefix(e.Id, entryIDPrefix); ok {
		ev = ev.Str(logkey.PodUID, uid)
	}
	if id, ok := strings.CutPrefix(e.Id, containerEntryIDPrefix); ok {
		ev = ev.Str("container", id)
	}
	ev.Msg(msg)
}

// sameEntry reports whether have is the entry want describes, in the fields the registrar
// sets.
func sameEntry(want, have *types.Entry) bool {
	return idString(want.SpiffeId) == idString(have.SpiffeId) &&
		idString(want.ParentId) == idString(have.ParentId) &&
		want.X509SvidTtl == have.X509SvidTtl && want.ExpiresAt == have.ExpiresAt &&
		slices.EqualFunc(sortedSelectors(want.Selectors), sortedSelectors(have.Selectors),
			func(a, b *types.Selector) bool { return a.Type == b.Type && a.Value == b.Value })
}

func sortedSelectors(s []*types.Selector) []*types.Selector {
	out := slices.Clone(s)
	slices.SortFunc(out, func(a, b *types.Selector) int {
		if c := strings.Compare(a.Type, b.Type); c != 0 {
			return c
		}
		return strings.Compare(a.Value, b.Value)
	})
	return out
}

func protoID(id spiffeid.ID) *types.SPIFFEID {
	return &types.SPIFFEID{TrustDomain: id.TrustDomain().Name(), Path: id.Path()}
}

func idString(id *types.SPIFFEID) string {
	if id == nil {
		return ""
	}
	return "spiffe://" + id.TrustDomain + id.Path
}

// ParseSelectors parses selectors written "type:value" (as spire-server's -selector flags
// take them).
func ParseSelectors(list []string) ([]*types.Selector, error) {
	var out []*types.Selector
	for _, part := range list {
		typ, val, ok := strings.Cut(part, ":")
		if !ok || typ == "" || val == "" {
			return nil, fmt.Errorf("selector %q: want type:value", part)
		}
		out = append(out, &types.Selector{Type: typ, Value: val})
	}
	return out, nil
}

// RBACRules are the only permissions the registrar needs, in the job namespace: reading Pods.
// deploy/kubernetes grants exactly these (a test keeps the two equal).
func RBACRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}
}
