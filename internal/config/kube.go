package config

import (
	"regexp"
	"strings"
	"time"
)

// KubePod configures the kubernetes pod backend (POD_BACKEND=kubernetes).
type KubePod struct {
	Namespace      string
	Kubeconfig     string // empty: in-cluster configuration
	Image          string
	CPURequest     string
	CPULimit       string
	MemoryRequest  string
	MemoryLimit    string
	ActiveDeadline time.Duration
	Grace          time.Duration
	ServiceAccount string
	PullSecrets    []string
	Privileged     bool
	SpiffeCSI      bool
}

var (
	imageNameByDigestRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$`)
	kubeNameRe          = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	quantityRe          = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$`)
)

// loadKube reads the POD_KUBE_* variables; it checks them only when the pod worker runs the
// kubernetes backend.
func loadKube(e *env, c Controller) KubePod {
	k := KubePod{
		Namespace:      e.str("POD_NAMESPACE", ""),
		Kubeconfig:     e.str("KUBECONFIG", ""),
		Image:          e.str("POD_EXECUTOR_IMAGE", ""),
		CPURequest:     e.str("POD_KUBE_CPU_REQUEST", "1"),
		CPULimit:       e.str("POD_KUBE_CPU_LIMIT", "2"),
		MemoryRequest:  e.str("POD_KUBE_MEMORY_REQUEST", "2Gi"),
		MemoryLimit:    e.str("POD_KUBE_MEMORY_LIMIT", "4Gi"),
		ActiveDeadline: e.duration("POD_ACTIVE_DEADLINE", 6*time.Hour, time.Minute),
		Grace:          e.duration("POD_KUBE_GRACE", 30*time.Second, time.Second),
		ServiceAccount: e.str("POD_SERVICE_ACCOUNT", "default"),
	}
	if v := e.str("POD_IMAGE_PULL_SECRETS", ""); v != "" {
		for _, s := range strings.Split(v, ",") {
			k.PullSecrets = append(k.PullSecrets, strings.TrimSpace(s))
		}
	}
	k.Privileged = e.boolean("POD_PRIVILEGED", true)
	k.SpiffeCSI = e.boolean("POD_SPIFFE_CSI", false)
	if !c.Has(PodWorker) || c.PodBackend != "kubernetes" {
		return k
	}
	if !kubeNameRe.MatchString(k.Namespace) {
		e.fail("POD_NAMESPACE=%q: the kubernetes backend needs the namespace its Pods run in (a DNS label)", k.Namespace)
	}
	if !imageNameByDigestRe.MatchString(k.Image) {
		e.fail("POD_EXECUTOR_IMAGE=%q: the kubernetes backend runs an image pinned by digest, name@sha256:<64 hex>; a tag is refused", k.Image)
	}
	for name, q := range map[string]string{"POD_KUBE_CPU_REQUEST": k.CPURequest, "POD_KUBE_CPU_LIMIT": k.CPULimit, "POD_KUBE_MEMORY_REQUEST": k.MemoryRequest, "POD_KUBE_MEMORY_LIMIT": k.MemoryLimit} {
		if !quantityRe.MatchString(q) {
			e.fail("%s=%q: want a Kubernetes quantity such as 500m, 2 or 4Gi", name, q)
		}
	}
	if !kubeNameRe.MatchString(k.ServiceAccount) {
		e.fail("POD_SERVICE_ACCOUNT=%q: want a DNS label", k.ServiceAccount)
	}
	for _, s := range k.PullSecrets {
		if !kubeNameRe.MatchString(s) {
			e.fail("POD_IMAGE_PULL_SECRETS: %q is not a DNS label", s)
		}
	}
	// In a cluster, identities come from SPIRE through the SPIFFE CSI driver; the development
	// CA is refused there.
	if !k.SpiffeCSI || c.SpiffeEndpointSocket == "" {
		e.fail("POD_BACKEND=kubernetes takes SVIDs from SPIRE only: set POD_SPIFFE_CSI=true and SPIFFE_ENDPOINT_SOCKET (the development CA is refused in a cluster)")
	}
	if lo := LoopbackURLs(c.FacadeURL); len(lo) > 0 {
		e.fail("RUNNER_FACADE_URL=%q: Pods cannot reach a loopback facade (%s); give the facade's Service URL", c.FacadeURL, strings.Join(lo, ", "))
	}
	return k
}

func (e *env) boolean(name string, def bool) bool {
	switch v, _ := e.lookup(name); v {
	case "":
		return def
	case "true":
		return true
	case "false":
		return false
	default:
		e.fail("%s=%q: want true or false", name, v)
		return def
	}
}
