package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// KEDAVersion is the KEDA release whose CustomResourceDefinitions scripts/k8s-tools.sh caches,
// kept in step with its KEDA_VERSION.
const KEDAVersion = "v2.21.1"

// KEDAToolsCommand caches the CustomResourceDefinitions KEDACRD finds (with the control plane).
const KEDAToolsCommand = "go tool task k8s-tools"

// crdEstablishTimeout bounds how long InstallCRDs waits for a CustomResourceDefinition to be
// established and served.
const crdEstablishTimeout = 30 * time.Second

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// KEDACRD returns the path of KEDA's CustomResourceDefinition file (as named in KEDA's
// config/crd/bases, such as keda.sh_scaledobjects.yaml) in the cache scripts/k8s-tools.sh
// fills: tools/keda-crds-<KEDAVersion>/ under $DYNRUNNER_CACHE or $HOME/.cache/dynrunner. The
// error says to run KEDAToolsCommand when the file is missing.
func KEDACRD(name string) (string, error) {
	root, err := cacheRoot()
	if err != nil {
		return "", err
	}
	path := filepath.Join(root, "tools", "keda-crds-"+KEDAVersion, name)
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		return "", fmt.Errorf("kubetest: KEDA %s's %s is not cached at %s; cache it with `%s` (seconds, once; or `bash scripts/k8s-tools.sh keda-crds`)",
			KEDAVersion, name, path, KEDAToolsCommand)
	}
	return path, nil
}

// InstallCRDs creates the CustomResourceDefinitions of the YAML file path (one or more
// documents) and waits, up to 30 seconds, until each is established and its resource is listed
// by discovery, so that a client mapping kinds to resources afterwards finds it. It fails the
// test on any error.
func (c *Cluster) InstallCRDs(t *testing.T, path string) {
	t.Helper()
	crds, err := readCRDs(path)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		t.Fatalf("kubetest: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), crdEstablishTimeout)
	defer cancel()
	for _, crd := range crds {
		if _, err := dyn.Resource(crdResource).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("kubetest: create CustomResourceDefinition %s from %s: %v", crd.GetName(), path, err)
		}
	}
	for _, crd := range crds {
		if err := waitServed(ctx, dyn, dc, crd); err != nil {
			t.Fatalf("kubetest: CustomResourceDefinition %s from %s: %v", crd.GetName(), path, err)
		}
	}
}

// readCRDs decodes the CustomResourceDefinitions of the YAML file path.
func readCRDs(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(bytes.TrimSpace(js)) == 0 || string(bytes.TrimSpace(js)) == "null" {
			continue
		}
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if obj.GroupVersionKind() != crdResource.GroupVersion().WithKind("CustomResourceDefinition") {
			return nil, fmt.Errorf("%s: %s %s is no apiextensions.k8s.io/v1 CustomResourceDefinition", path, obj.GetKind(), obj.GetName())
		}
		out = append(out, obj)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no CustomResourceDefinition", path)
	}
	return out, nil
}

// waitServed polls, until ctx ends, for crd's condition Established and for discovery to list
// its plural in each served version.
func waitServed(ctx context.Context, dyn dynamic.Interface, dc discovery.DiscoveryInterface, crd *unstructured.Unstructured) error {
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := served(ctx, dyn, dc, crd.GetName(), group, plural, versions)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not served within %s: %w", crdEstablishTimeout, err)
		case <-tick.C:
		}
	}
}

// served reports, as nil, that the CustomResourceDefinition name is established and that
// discovery lists plural in group at each of versions that is served.
func served(ctx context.Context, dyn dynamic.Interface, dc discovery.DiscoveryInterface, name, group, plural string, versions []any) error {
	got, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	conditions, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
	established := false
	for _, c := range conditions {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			established = true
		}
	}
	if !established {
		return errors.New("condition Established is not True")
	}
	for _, v := range versions {
		m, _ := v.(map[string]any)
		version, _ := m["name"].(string)
		if s, _ := m["served"].(bool); !s {
			continue
		}
		list, err := dc.ServerResourcesForGroupVersion(group + "/" + version)
		if err != nil {
			return fmt.Errorf("discovery of %s/%s: %w", group, version, err)
		}
		found := false
		for _, r := range list.APIResources {
			found = found || r.Name == plural
		}
		if !found {
			return fmt.Errorf("discovery of %s/%s does not list %s", group, version, plural)
		}
	}
	return nil
}
