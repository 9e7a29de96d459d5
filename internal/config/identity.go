package config

import (
	"errors"
	"net"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// IdentityVars are the variables of `dynrunner identity`, the SPIRE registrar of job Pods
// and job containers.
var IdentityVars = []Var{
	{"IDENTITY_SOURCE", "kubernetes", "Where the job environments are: kubernetes (the Pods of POD_NAMESPACE) or docker (the containers of IDENTITY_DOCKER_SCOPE on the local Docker engine)."},
	{"POD_NAMESPACE", "", "Namespace of the job Pods to register. Required with IDENTITY_SOURCE=kubernetes."},
	{"KUBECONFIG", "", "Kubeconfig file; empty: the in-cluster configuration."},
	{"SPIRE_SERVER_SOCKET", "/tmp/spire-server/private/api.sock", "The SPIRE server's local admin API socket (the registrar runs beside the server, sharing this socket)."},
	{"SPIFFE_TRUST_DOMAIN", "dynrunner.local", "Trust domain of the assignment identities; the controller's must be the same."},
	{"IDENTITY_PARENT_ID", "", "SPIFFE ID every Pod entry is parented to: the node alias (with IDENTITY_NODE_ALIAS_SELECTORS) or the SPIRE agent of the job nodes. Required."},
	{"IDENTITY_NODE_ALIAS_SELECTORS", "", "When set (type:value,...; e.g. k8s_psat:cluster:dynrunner), the registrar keeps a node alias entry IDENTITY_PARENT_ID with these node selectors, so every matching agent can serve job Pods."},
	{"IDENTITY_FACADE_SELECTORS", "", "When set (type:value,...; e.g. k8s:ns:dynrunner,k8s:sa:dynrunner-controller), the registrar also keeps the entry giving the controller workloads these select the facade's identity RUNNER_FACADE_SPIFFE_ID."},
	{"RUNNER_FACADE_SPIFFE_ID", "spiffe://<SPIFFE_TRUST_DOMAIN>/dynrunner/facade", "The facade's SPIFFE ID (the controller's setting of the same name)."},
	{"IDENTITY_FACADE_PARENT_ID", "", "With IDENTITY_FACADE_NODE_SELECTORS: a node alias for the controller's nodes only, kept by the registrar and made the parent of the facade's entry instead of IDENTITY_PARENT_ID, so agents of nodes running job Pods cannot serve the facade's SVID."},
	{"IDENTITY_FACADE_NODE_SELECTORS", "", "type:value,... node selectors of that alias (e.g. k8s_psat:cluster:dynrunner,k8s_psat:agent_node_label:dynrunner.io/facade:true)."},
	{"IDENTITY_DOCKER_SOCKET", "/var/run/docker.sock", "With IDENTITY_SOURCE=docker: the Docker engine's unix socket (the controller's POD_DOCKER_SOCKET)."},
	{"IDENTITY_DOCKER_SCOPE", "default", "With IDENTITY_SOURCE=docker: the scope of the job containers to register (the controller's POD_DOCKER_SCOPE)."},
	{"IDENTITY_SELECTORS", "k8s", "How entries select their Pod: k8s (k8s:pod-uid:<uid>, k8s:ns:<ns>; SPIRE's k8s workload attestor) or docker (the docker workload attestor on the Pod UID and namespace labels of dockershim/cri-dockerd containers)."},
	{"IDENTITY_SVID_TTL", "10m", "X509-SVID lifetime of Pod entries (at least 1m); agents rotate SVIDs before they end."},
	{"IDENTITY_RESYNC", "30s", "Interval of full reconciliations besides those Pod or container events trigger (at least 1s)."},
	{"HTTP_LISTEN", "127.0.0.1:9465", "Address of /healthz, /readyz (ready after the first successful reconciliation, which sweeps stale entries) and /metrics."},
	{"LOG_FORMAT", "json", "json, or console for humans."},
	{"LOG_LEVEL", "info", "trace, debug, info, warn or error."},
}

// credentialVars are variables naming credentials of the controller; the registrar holds
// none of them, and refuses to start when one is set in its environment.
var credentialVars = []string{
	"GITEA_RUNNER_TOKEN_FILE", "GITEA_RUNNER_REGISTRATION_TOKEN_FILE", "GITEA_RUNNER_UUID_FILE",
	"OPENSANDBOX_API_KEY_FILE", "RUNNER_FACADE_CAPABILITY_KEY_FILE", "TASK_ENCRYPTION_KEY_FILE", "NATS_PASSWORD_FILE",
}

// Identity configures `dynrunner identity`.
type Identity struct {
	Source              string // kubernetes or docker
	Namespace           string
	DockerSocket        string
	DockerScope         string
	Kubeconfig          string
	ServerSocket        string
	TrustDomain         spiffeid.TrustDomain
	ParentID            spiffeid.ID
	NodeAliasSelectors  []string // type:value
	FacadeSelectors     []string // type:value
	FacadeID            spiffeid.ID
	FacadeParentID      spiffeid.ID
	FacadeNodeSelectors []string // type:value
	Selectors           string
	SVIDTTL             time.Duration
	Resync              time.Duration
	HTTPListen          string
	LogFormat           string
	LogLevel            string
}

// LoadIdentity reads the registrar's configuration. All problems are reported together.
func LoadIdentity(getenv func(string) string) (Identity, error) {
	e := &env{get: getenv}
	c := Identity{
		Source:       e.str("IDENTITY_SOURCE", "kubernetes"),
		Namespace:    e.str("POD_NAMESPACE", ""),
		DockerSocket: strings.TrimPrefix(e.str("IDENTITY_DOCKER_SOCKET", "/var/run/docker.sock"), "unix://"),
		DockerScope:  e.str("IDENTITY_DOCKER_SCOPE", "default"),
		Kubeconfig:   e.str("KUBECONFIG", ""),
		ServerSocket: strings.TrimPrefix(e.str("SPIRE_SERVER_SOCKET", "/tmp/spire-server/private/api.sock"), "unix://"),
		Selectors:    e.str("IDENTITY_SELECTORS", "k8s"),
		SVIDTTL:      e.duration("IDENTITY_SVID_TTL", 10*time.Minute, time.Minute),
		Resync:       e.duration("IDENTITY_RESYNC", 30*time.Second, time.Second),
		HTTPListen:   e.str("HTTP_LISTEN", "127.0.0.1:9465"),
		LogFormat:    e.str("LOG_FORMAT", "json"),
		LogLevel:     e.str("LOG_LEVEL", "info"),
	}
	for _, v := range credentialVars {
		if _, set := e.lookup(v); set {
			e.fail("%s is set: the identity registrar holds no forge, OpenSandbox or controller credential; unset it in its environment", v)
		}
	}
	switch c.Source {
	case "kubernetes":
		if !kubeNameRe.MatchString(c.Namespace) {
			e.fail("POD_NAMESPACE=%q: the registrar needs the namespace of the job Pods (a DNS label)", c.Namespace)
		}
	case "docker":
		if !strings.HasPrefix(c.DockerSocket, "/") {
			e.fail("IDENTITY_DOCKER_SOCKET=%q: want the absolute path of the Docker engine's unix socket", c.DockerSocket)
		}
		if !dockerScopeRe.MatchString(c.DockerScope) {
			e.fail("IDENTITY_DOCKER_SCOPE=%q: want 1 to 32 lowercase letters and digits (the controller's POD_DOCKER_SCOPE)", c.DockerScope)
		}
	default:
		e.fail("IDENTITY_SOURCE=%q: want kubernetes or docker", c.Source)
	}
	if !strings.HasPrefix(c.ServerSocket, "/") {
		e.fail("SPIRE_SERVER_SOCKET=%q: want the absolute path of the SPIRE server's admin socket", c.ServerSocket)
	}
	td, err := spiffeid.TrustDomainFromString(e.str("SPIFFE_TRUST_DOMAIN", "dynrunner.local"))
	if err != nil {
		e.fail("SPIFFE_TRUST_DOMAIN: %v", err)
	}
	c.TrustDomain = td
	if v, ok := e.lookup("IDENTITY_PARENT_ID"); !ok {
		e.fail("IDENTITY_PARENT_ID is required: the SPIFFE ID of the node alias or agent that job Pod entries are parented to")
	} else if id, err := spiffeid.FromString(v); err != nil {
		e.fail("IDENTITY_PARENT_ID=%q: %v", v, err)
	} else if !td.IsZero() && !id.MemberOf(td) {
		e.fail("IDENTITY_PARENT_ID=%q is not in trust domain %s", v, td)
	} else {
		c.ParentID = id
	}
	c.NodeAliasSelectors = e.selectors("IDENTITY_NODE_ALIAS_SELECTORS", "k8s_psat:cluster:dynrunner")
	c.FacadeSelectors = e.selectors("IDENTITY_FACADE_SELECTORS", "k8s:sa:dynrunner-controller")
	c.FacadeNodeSelectors = e.selectors("IDENTITY_FACADE_NODE_SELECTORS", "k8s_psat:agent_node_label:dynrunner.io/facade:true")
	if v, ok := e.lookup("IDENTITY_FACADE_PARENT_ID"); ok {
		if id, err := spiffeid.FromString(v); err != nil {
			e.fail("IDENTITY_FACADE_PARENT_ID=%q: %v", v, err)
		} else if !td.IsZero() && !id.MemberOf(td) {
			e.fail("IDENTITY_FACADE_PARENT_ID=%q is not in trust domain %s", v, td)
		} else {
			c.FacadeParentID = id
		}
	}
	if (len(c.FacadeNodeSelectors) > 0) != (e.str("IDENTITY_FACADE_PARENT_ID", "") != "") {
		e.fail("IDENTITY_FACADE_PARENT_ID and IDENTITY_FACADE_NODE_SELECTORS go together: the facade nodes' alias and the node selectors it stands for")
	} else if len(c.FacadeNodeSelectors) > 0 && len(c.FacadeSelectors) == 0 {
		e.fail("IDENTITY_FACADE_PARENT_ID needs IDENTITY_FACADE_SELECTORS: without the facade's entry there is nothing to parent")
	}
	if v, ok := e.lookup("RUNNER_FACADE_SPIFFE_ID"); ok {
		if id, err := spiffeid.FromString(v); err != nil {
			e.fail("RUNNER_FACADE_SPIFFE_ID=%q: %v", v, err)
		} else if !td.IsZero() && !id.MemberOf(td) {
			e.fail("RUNNER_FACADE_SPIFFE_ID=%q is not in trust domain %s", v, td)
		} else {
			c.FacadeID = id
		}
	}
	if c.Selectors != "k8s" && c.Selectors != "docker" {
		e.fail("IDENTITY_SELECTORS=%q: want k8s or docker", c.Selectors)
	}
	if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
		e.fail("HTTP_LISTEN=%q: want host:port", c.HTTPListen)
	}
	return c, errors.Join(e.errs...)
}

// selectors parses a comma-separated list of type:value selectors; example is shown in the
// error for a malformed one.
func (e *env) selectors(name, example string) []string {
	var out []string
	for part := range strings.SplitSeq(e.str(name, ""), ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if typ, val, ok := strings.Cut(part, ":"); !ok || typ == "" || val == "" {
			e.fail("%s: %q: want type:value (such as %s)", name, part, example)
			continue
		}
		out = append(out, part)
	}
	return out
}
