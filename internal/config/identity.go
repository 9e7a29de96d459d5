package config

import (
	"errors"
	"net"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

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
	if id, set := e.spiffeIDIn("IDENTITY_PARENT_ID", td); !set {
		e.fail("IDENTITY_PARENT_ID is required: the SPIFFE ID of the node alias or agent that job Pod entries are parented to")
	} else {
		c.ParentID = id
	}
	c.NodeAliasSelectors = e.selectors("IDENTITY_NODE_ALIAS_SELECTORS", "k8s_psat:cluster:dynrunner")
	c.FacadeSelectors = e.selectors("IDENTITY_FACADE_SELECTORS", "k8s:sa:dynrunner-controller")
	c.FacadeNodeSelectors = e.selectors("IDENTITY_FACADE_NODE_SELECTORS", "k8s_psat:agent_node_label:dynrunner.io/facade:true")
	c.FacadeParentID, _ = e.spiffeIDIn("IDENTITY_FACADE_PARENT_ID", td)
	if (len(c.FacadeNodeSelectors) > 0) != (e.str("IDENTITY_FACADE_PARENT_ID", "") != "") {
		e.fail("IDENTITY_FACADE_PARENT_ID and IDENTITY_FACADE_NODE_SELECTORS go together: the facade nodes' alias and the node selectors it stands for")
	} else if len(c.FacadeNodeSelectors) > 0 && len(c.FacadeSelectors) == 0 {
		e.fail("IDENTITY_FACADE_PARENT_ID needs IDENTITY_FACADE_SELECTORS: without the facade's entry there is nothing to parent")
	}
	c.FacadeID, _ = e.spiffeIDIn("RUNNER_FACADE_SPIFFE_ID", td)
	if c.Selectors != "k8s" && c.Selectors != "docker" {
		e.fail("IDENTITY_SELECTORS=%q: want k8s or docker", c.Selectors)
	}
	if _, _, err := net.SplitHostPort(c.HTTPListen); err != nil {
		e.fail("HTTP_LISTEN=%q: want host:port", c.HTTPListen)
	}
	return c, errors.Join(e.errs...)
}

// spiffeIDIn parses the SPIFFE ID in variable name, which must be a member of trust domain td
// (of any when td is zero: its own variable failed). set reports whether name is set at all;
// a set value that is malformed or of another trust domain is recorded as a failure and gives
// the zero ID.
func (e *env) spiffeIDIn(name string, td spiffeid.TrustDomain) (id spiffeid.ID, set bool) {
	v, set := e.lookup(name)
	if !set {
		return spiffeid.ID{}, false
	}
	id, err := spiffeid.FromString(v)
	switch {
	case err != nil:
		e.fail("%s=%q: %v", name, v, err)
		return spiffeid.ID{}, true
	case !td.IsZero() && !id.MemberOf(td):
		e.fail("%s=%q is not in trust domain %s (SPIFFE_TRUST_DOMAIN)", name, v, td)
		return spiffeid.ID{}, true
	}
	return id, true
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
