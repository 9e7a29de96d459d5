package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/dynrunner/dynrunner/identity"
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
	if k.Kind != "Kustomization" || len(k.Resources) == 0 {
		t.Fatalf("kustomization.yaml: kind %q with %d resources", k.Kind, len(k.Resources))
	}
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
	if len(out) == 0 {
		t.Fatal("no objects")
	}
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
		if !slices.Contains(listed, name) {
			t.Errorf("%s is not in kustomization.yaml's resources", name)
		}
	}
	for _, name := range listed {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("kustomization.yaml lists %s: %v", name, err)
		}
	}
	if len(listed) != len(slices.Compact(slices.Sorted(slices.Values(listed)))) {
		t.Errorf("kustomization.yaml lists a file twice: %v", listed)
	}
}

// TestManifestsDryRun submits every object to a real kube-apiserver with a server-side dry
// run (after creating the namespaces for real), so schema, validation and admission errors
// show up here instead of at kubectl apply.
func TestManifestsDryRun(t *testing.T) {
	objs := load(t)
	c := kubetest.Start(t)
	ctx := t.Context()

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

// TestRoleIsRBACRules keeps the controller's Role equal to podworker/kube.RBACRules() and the
// identity registrar's to identity.RBACRules().
func TestRoleIsRBACRules(t *testing.T) {
	manifests := load(t)
	for name, want := range map[string][]rbacv1.PolicyRule{
		"dynrunner-controller": kube.RBACRules(),
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
			if !equality.Semantic.DeepEqual(role.Rules, want) {
				t.Errorf("%s: rules %+v, want %+v", m, role.Rules, want)
			}
		}
		if !found {
			t.Errorf("no Role dynrunner-jobs/%s", name)
		}
	}
}
