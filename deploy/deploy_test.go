package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/dynrunner/dynrunner/identity"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/testbed/kubetest"
	"github.com/dynrunner/dynrunner/podworker/kube"
)

const dir = "kubernetes"

var schemaNamespaces = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// manifest is one object of a file listed in the kustomization.
type manifest struct {
	file string
	obj  *unstructured.Unstructured
}

func (m manifest) String() string {
	name := m.obj.GetName()
	if ns := m.obj.GetNamespace(); ns != "" {
		name = ns + "/" + name
	}
	return fmt.Sprintf("%s: %s %s", m.file, m.obj.GetKind(), name)
}

// resources returns the kustomization's resources list.
func resources(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	require.NoError(t, err)
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	require.NoError(t, yaml.UnmarshalStrict(data, &k), "kustomization.yaml")
	require.Equal(t, "Kustomization", k.Kind, "kustomization.yaml: kind")
	require.NotEmpty(t, k.Resources, "kustomization.yaml: resources")
	return k.Resources
}

// load decodes every document of every listed file.
func load(t *testing.T) []manifest {
	t.Helper()
	var out []manifest
	var errs []error
	for _, file := range resources(t) {
		data, err := os.ReadFile(filepath.Join(dir, file))
		require.NoError(t, err)
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for doc := 1; ; doc++ {
			raw, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, "%s: document %d", file, doc)
			if len(bytes.TrimSpace(stripComments(raw))) == 0 {
				continue
			}
			js, err := yaml.YAMLToJSONStrict(raw)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", file, doc, err))
				continue
			}
			obj := &unstructured.Unstructured{}
			if err := obj.UnmarshalJSON(js); err != nil {
				errs = append(errs, fmt.Errorf("%s: document %d: %w", file, doc, err))
				continue
			}
			out = append(out, manifest{file: file, obj: obj})
		}
	}
	require.NoError(t, errors.Join(errs...))
	require.NotEmpty(t, out, "no objects")
	return out
}

func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for _, line := range strings.Split(string(doc), "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") && t != "---" {
			b.WriteString(line + "\n")
		}
	}
	return b.Bytes()
}

func TestKustomizationListsEveryFile(t *testing.T) {
	listed := resources(t)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || name == "kustomization.yaml" || (!strings.HasSuffix(name, ".yaml") && !strings.HasSuffix(name, ".yml")) {
			continue
		}
		assert.Contains(t, listed, name, "%s is not in kustomization.yaml's resources", name)
	}
	for _, name := range listed {
		_, err := os.Stat(filepath.Join(dir, name))
		assert.NoError(t, err, "kustomization.yaml lists %s", name)
	}
	sorted := slices.Sorted(slices.Values(listed))
	assert.Equal(t, sorted, slices.Compact(slices.Clone(sorted)), "kustomization.yaml lists a file twice: %v", listed)
}

// TestManifestsDryRun submits every object to a real kube-apiserver with a server-side dry
// run (after creating the namespaces for real), so schema, validation and admission errors
// show up here instead of at kubectl apply.
func TestManifestsDryRun(t *testing.T) {
	objs := load(t)
	c := kubetest.Start(t)
	ctx := t.Context()

	// pod-worker-keda.yaml is a KEDA ScaledObject: its CRD, which operators install with KEDA,
	// comes from the cache scripts/k8s-tools.sh fills.
	crd, err := kubetest.KEDACRD("keda.sh_scaledobjects.yaml")
	require.NoError(t, err)
	c.InstallCRDs(t, crd)

	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	require.NoError(t, err)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(c.Config)
	require.NoError(t, err)

	var errs []error
	var namespaced []manifest
	for _, m := range objs {
		if m.obj.GetAPIVersion() == "v1" && m.obj.GetKind() == "Namespace" {
			nsRes := dyn.Resource(schemaNamespaces)
			if _, err := nsRes.Create(ctx, m.obj.DeepCopy(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				errs = append(errs, fmt.Errorf("%s: create: %w", m, err))
			}
			continue
		}
		namespaced = append(namespaced, m)
	}
	require.NoError(t, errors.Join(errs...))

	seen := map[string]bool{}
	for _, m := range namespaced {
		key := m.obj.GroupVersionKind().String() + "/" + m.obj.GetNamespace() + "/" + m.obj.GetName()
		if seen[key] {
			errs = append(errs, fmt.Errorf("%s: defined twice", m))
		}
		seen[key] = true
		gvk := m.obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m, err))
			continue
		}
		var ri dynamic.ResourceInterface
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if m.obj.GetNamespace() == "" {
				errs = append(errs, fmt.Errorf("%s: namespaced kind without a namespace", m))
				continue
			}
			ri = dyn.Resource(mapping.Resource).Namespace(m.obj.GetNamespace())
		} else {
			if m.obj.GetNamespace() != "" {
				errs = append(errs, fmt.Errorf("%s: cluster-scoped kind with a namespace", m))
				continue
			}
			ri = dyn.Resource(mapping.Resource)
		}
		_, err = ri.Create(ctx, m.obj.DeepCopy(), metav1.CreateOptions{
			DryRun:          []string{metav1.DryRunAll},
			FieldValidation: metav1.FieldValidationStrict,
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m, err))
			continue
		}
		t.Logf("accepted %s", m)
	}
	require.NoError(t, errors.Join(errs...), "%d of %d objects refused:\n", len(errs), len(objs))
}

// TestRoleIsRBACRules keeps the pod workers' Role equal to podworker/kube.RBACRules() and the
// identity registrar's to identity.RBACRules().
func TestRoleIsRBACRules(t *testing.T) {
	manifests := load(t)
	for name, want := range map[string][]rbacv1.PolicyRule{
		"dynrunner-pod-worker": kube.RBACRules(),
		"dynrunner-identity":   identity.RBACRules(),
	} {
		found := false
		for _, m := range manifests {
			if m.obj.GetKind() != "Role" || m.obj.GetNamespace() != "dynrunner-jobs" || m.obj.GetName() != name {
				continue
			}
			found = true
			var role rbacv1.Role
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(m.obj.Object, &role), "%s", m)
			// Semantic equality (a nil list equals an empty one); Equal only to show the diff.
			if !equality.Semantic.DeepEqual(role.Rules, want) {
				assert.Equal(t, want, role.Rules, "%s: rules", m)
			}
		}
		assert.True(t, found, "no Role dynrunner-jobs/%s", name)
	}
}

// process is one Deployment that runs `dynrunner controller`.
type process struct {
	m          manifest
	deployment appsv1.Deployment
	container  corev1.Container
	env        map[string]string
}

// has reports whether the process's COMPONENTS names component.
func (p process) has(component string) bool {
	return slices.Contains(strings.Split(p.env["COMPONENTS"], ","), component)
}

// processes returns the Deployments of the manifests that run `dynrunner controller`, with the
// environment of that container (literal values only).
func processes(t *testing.T, manifests []manifest) []process {
	t.Helper()
	var out []process
	for _, m := range manifests {
		if m.obj.GetKind() != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(m.obj.Object, &d), "%s", m)
		for _, c := range d.Spec.Template.Spec.Containers {
			if !slices.Equal(c.Args, []string{"controller"}) {
				continue
			}
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			out = append(out, process{m: m, deployment: d, container: c, env: env})
		}
	}
	require.NotEmpty(t, out, "no Deployment runs dynrunner controller")
	return out
}

// TestProcessesConfigurationLoads checks that the configuration of every Deployment running
// `dynrunner controller` passes config.LoadController (with the placeholders in place), that
// only the pod workers get a Kubernetes token, and that it is bound to the Role of
// podworker/kube.RBACRules() (TestRoleIsRBACRules).
func TestProcessesConfigurationLoads(t *testing.T) {
	manifests := load(t)
	bound := map[string]bool{} // namespace/name of the ServiceAccounts bound to dynrunner-pod-worker
	for _, m := range manifests {
		if m.obj.GetKind() != "RoleBinding" || m.obj.GetNamespace() != "dynrunner-jobs" {
			continue
		}
		var rb rbacv1.RoleBinding
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(m.obj.Object, &rb), "%s", m)
		if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != "dynrunner-pod-worker" {
			continue
		}
		for _, s := range rb.Subjects {
			if s.Kind == "ServiceAccount" {
				bound[s.Namespace+"/"+s.Name] = true
			}
		}
	}
	workers := 0
	for _, p := range processes(t, manifests) {
		cfg, err := config.LoadController(func(name string) string { return p.env[name] })
		require.NoError(t, err, "%s", p.m)
		spec := p.deployment.Spec.Template.Spec
		sa := p.deployment.Namespace + "/" + spec.ServiceAccountName
		if cfg.Has(config.PodWorker) {
			workers++
			assert.Equal(t, "kubernetes", cfg.PodBackend, "%s", p.m)
			assert.True(t, bound[sa], "%s: ServiceAccount %s is not bound to the Role dynrunner-pod-worker", p.m, sa)
			continue
		}
		assert.False(t, bound[sa], "%s: ServiceAccount %s may create job Pods, but runs no pod worker", p.m, sa)
		if assert.NotNil(t, spec.AutomountServiceAccountToken, "%s: automountServiceAccountToken", p.m) {
			assert.False(t, *spec.AutomountServiceAccountToken, "%s: a process without the pod worker needs no Kubernetes token", p.m)
		}
	}
	assert.Positive(t, workers, "no Deployment runs the pod worker")
}

// TestScaledObjectScalesPodWorkersThroughDrain checks the KEDA ScaledObject against the
// Deployments: it scales Deployments of pod workers alone, which drain on SIGTERM (DRAIN_SECS)
// within their grace period, from the autoscaling decision that a Service of another
// Deployment answers, so the signal stays at zero workers.
func TestScaledObjectScalesPodWorkersThroughDrain(t *testing.T) {
	manifests := load(t)
	procs := processes(t, manifests)
	found := 0
	for _, m := range manifests {
		if m.obj.GetAPIVersion() != "keda.sh/v1alpha1" || m.obj.GetKind() != "ScaledObject" {
			continue
		}
		found++
		var so struct {
			Spec struct {
				ScaleTargetRef struct {
					APIVersion string `json:"apiVersion"`
					Kind       string `json:"kind"`
					Name       string `json:"name"`
				} `json:"scaleTargetRef"`
				MinReplicaCount *int32 `json:"minReplicaCount"`
				MaxReplicaCount *int32 `json:"maxReplicaCount"`
				Triggers        []struct {
					Type       string            `json:"type"`
					MetricType string            `json:"metricType"`
					Metadata   map[string]string `json:"metadata"`
				} `json:"triggers"`
			} `json:"spec"`
		}
		require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(m.obj.Object, &so), "%s", m)
		ref := so.Spec.ScaleTargetRef
		assert.Equal(t, "apps/v1", ref.APIVersion, "%s", m)
		assert.Equal(t, "Deployment", ref.Kind, "%s", m)
		i := slices.IndexFunc(procs, func(p process) bool {
			return p.deployment.Namespace == m.obj.GetNamespace() && p.deployment.Name == ref.Name
		})
		require.GreaterOrEqual(t, i, 0, "%s: scales %s, no Deployment running dynrunner controller", m, ref.Name)
		target := procs[i]
		assert.Equal(t, config.PodWorker, target.env["COMPONENTS"], "%s: scales %s, which must run the pod worker alone", m, target.m)
		assert.Nil(t, target.deployment.Spec.Replicas, "%s: sets replicas, which the ScaledObject owns", target.m)
		drain, err := strconv.Atoi(target.env["DRAIN_SECS"])
		require.NoError(t, err, "%s: DRAIN_SECS", target.m)
		assert.Positive(t, drain, "%s: DRAIN_SECS: scale-in must drain the worker", target.m)
		grace := target.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds
		if assert.NotNil(t, grace, "%s: terminationGracePeriodSeconds", target.m) {
			assert.Greater(t, *grace, int64(drain), "%s: terminationGracePeriodSeconds must outlast DRAIN_SECS", target.m)
		}
		require.NotNil(t, so.Spec.MaxReplicaCount, "%s: maxReplicaCount", m)
		perWorker, err := strconv.Atoi(target.env["POD_CONCURRENCY"])
		require.NoError(t, err, "%s: POD_CONCURRENCY", target.m)

		require.Len(t, so.Spec.Triggers, 1, "%s", m)
		tr := so.Spec.Triggers[0]
		assert.Equal(t, "metrics-api", tr.Type, "%s", m)
		assert.Equal(t, "AverageValue", tr.MetricType, "%s: replicas = desired_workers only with AverageValue", m)
		assert.Equal(t, "1", tr.Metadata["targetValue"], "%s: replicas = desired_workers only with target 1", m)
		assert.Equal(t, "tiers.pod.desired_workers", tr.Metadata["valueLocation"], "%s", m)
		u, err := url.Parse(tr.Metadata["url"])
		require.NoError(t, err, "%s: url", m)
		assert.Equal(t, "/v1/fleet/autoscale", u.Path, "%s: url", m)
		host := strings.Split(u.Hostname(), ".")
		require.GreaterOrEqual(t, len(host), 2, "%s: url %s: want <service>.<namespace>.svc", m, u)
		svc := serviceOf(t, manifests, host[1], host[0])
		require.NotNil(t, svc, "%s: url %s names no Service of the manifests", m, u)
		port := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return strconv.Itoa(int(p.Port)) == u.Port() })
		require.GreaterOrEqual(t, port, 0, "%s: url %s: Service %s has no port %s", m, u, svc.Name, u.Port())
		// The Service's Pods answer the decision on HTTP_LISTEN: they run dynrunner, not the
		// pod worker alone, and the one that owns the fleet's room is the scheduler.
		selected := 0
		for _, p := range procs {
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(p.deployment.Spec.Template.Labels)) {
				continue
			}
			selected++
			assert.NotEqual(t, target.deployment.Name, p.deployment.Name, "%s: the decision comes from the Deployment it scales: nothing answers at zero", m)
			assert.True(t, p.has(config.Scheduler), "%s: %s answers the decision but runs no scheduler", m, p.m)
			_, httpPort, err := net.SplitHostPort(p.env["HTTP_LISTEN"])
			require.NoError(t, err, "%s: HTTP_LISTEN", p.m)
			assert.Equal(t, httpPort, p.containerPort(svc.Spec.Ports[port].TargetPort), "%s: Service port %s does not lead to HTTP_LISTEN", m, u.Port())
			// Admission follows the workers KEDA runs, and the demand beyond them is queued
			// where the decision sees it; the scheduler's POD_CONCURRENCY is one worker's, for
			// deciding from zero.
			assert.Equal(t, config.CapacityWorkers, p.env["ADMIT_CAPACITY"], "%s: %s must take its capacity from the workers KEDA runs", m, p.m)
			queued, err := strconv.Atoi(p.env["MAX_QUEUED"])
			assert.True(t, err == nil && queued > 0, "%s: %s needs MAX_QUEUED: demand beyond the workers online must be visible to the decision", m, p.m)
			assert.Equal(t, strconv.Itoa(perWorker), p.env["POD_CONCURRENCY"],
				"%s: POD_CONCURRENCY of %s must be one worker's (the workers' POD_CONCURRENCY)", m, p.m)
		}
		assert.Positive(t, selected, "%s: Service %s selects no dynrunner Deployment", m, svc.Name)
	}
	assert.Equal(t, 1, found, "ScaledObjects")
}

// containerPort resolves a Service's targetPort, a number or the name of a port of the
// container, to the number, as a string ("" when the container has no such port).
func (p process) containerPort(target intstr.IntOrString) string {
	if target.Type == intstr.Int {
		return target.String()
	}
	for _, cp := range p.container.Ports {
		if cp.Name == target.StrVal {
			return strconv.Itoa(int(cp.ContainerPort))
		}
	}
	return ""
}

// serviceOf returns the Service namespace/name of the manifests, or nil.
func serviceOf(t *testing.T, manifests []manifest, namespace, name string) *corev1.Service {
	t.Helper()
	for _, m := range manifests {
		if m.obj.GetKind() == "Service" && m.obj.GetNamespace() == namespace && m.obj.GetName() == name {
			var svc corev1.Service
			require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(m.obj.Object, &svc), "%s", m)
			return &svc
		}
	}
	return nil
}
