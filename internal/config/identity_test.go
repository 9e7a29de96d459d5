package config

import (
	"strings"
	"testing"
	"time"
)

func identityEnv(kv map[string]string) func(string) string {
	base := map[string]string{
		"POD_NAMESPACE":      "dynrunner-jobs",
		"IDENTITY_PARENT_ID": "spiffe://dynrunner.local/dynrunner/nodes",
	}
	for k, v := range kv {
		base[k] = v
	}
	return func(k string) string { return base[k] }
}

func TestLoadIdentityDefaults(t *testing.T) {
	c, err := LoadIdentity(identityEnv(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.ServerSocket != "/tmp/spire-server/private/api.sock" || c.Selectors != "k8s" || c.SVIDTTL != 10*time.Minute ||
		c.Resync != 30*time.Second || c.HTTPListen != "127.0.0.1:9465" || c.TrustDomain.Name() != "dynrunner.local" ||
		c.ParentID.String() != "spiffe://dynrunner.local/dynrunner/nodes" || len(c.NodeAliasSelectors) != 0 {
		t.Fatalf("defaults: %+v", c)
	}
	c, err = LoadIdentity(identityEnv(map[string]string{
		"SPIRE_SERVER_SOCKET":           "unix:///run/spire/api.sock",
		"IDENTITY_NODE_ALIAS_SELECTORS": "k8s_psat:cluster:dynrunner, k8s_psat:agent_ns:spire",
		"IDENTITY_SELECTORS":            "docker",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.ServerSocket != "/run/spire/api.sock" || c.Selectors != "docker" ||
		strings.Join(c.NodeAliasSelectors, ",") != "k8s_psat:cluster:dynrunner,k8s_psat:agent_ns:spire" {
		t.Fatalf("set: %+v", c)
	}
	if c.Source != "kubernetes" {
		t.Fatalf("default source %q, want kubernetes", c.Source)
	}
	// The docker source needs no namespace.
	c, err = LoadIdentity(identityEnv(map[string]string{"IDENTITY_SOURCE": "docker", "POD_NAMESPACE": ""}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Source != "docker" || c.DockerSocket != "/var/run/docker.sock" || c.DockerScope != "default" {
		t.Fatalf("docker defaults: %+v", c)
	}
	c, err = LoadIdentity(identityEnv(map[string]string{"IDENTITY_SOURCE": "docker",
		"IDENTITY_DOCKER_SOCKET": "unix:///run/docker.sock", "IDENTITY_DOCKER_SCOPE": "ci2"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.DockerSocket != "/run/docker.sock" || c.DockerScope != "ci2" {
		t.Fatalf("docker set: %+v", c)
	}
}

// TestLoadIdentityFailsClosed: every half-configured setting is refused with a message
// naming the variable, and the registrar refuses to hold a controller credential.
func TestLoadIdentityFailsClosed(t *testing.T) {
	for name, tc := range map[string]struct {
		env  map[string]string
		want string
	}{
		"no namespace":                         {map[string]string{"POD_NAMESPACE": " "}, "POD_NAMESPACE"},
		"no parent":                            {map[string]string{"IDENTITY_PARENT_ID": ""}, "IDENTITY_PARENT_ID is required"},
		"parent not spiffe":                    {map[string]string{"IDENTITY_PARENT_ID": "https://x/y"}, "IDENTITY_PARENT_ID"},
		"parent other domain":                  {map[string]string{"IDENTITY_PARENT_ID": "spiffe://other.example/nodes"}, "not in trust domain"},
		"relative socket":                      {map[string]string{"SPIRE_SERVER_SOCKET": "api.sock"}, "SPIRE_SERVER_SOCKET"},
		"bad selectors mode":                   {map[string]string{"IDENTITY_SELECTORS": "unix"}, "IDENTITY_SELECTORS"},
		"bad alias selector":                   {map[string]string{"IDENTITY_NODE_ALIAS_SELECTORS": "k8s_psat"}, "IDENTITY_NODE_ALIAS_SELECTORS"},
		"short ttl":                            {map[string]string{"IDENTITY_SVID_TTL": "30s"}, "IDENTITY_SVID_TTL"},
		"forge token":                          {map[string]string{"GITEA_RUNNER_TOKEN_FILE": "/run/secrets/token"}, "GITEA_RUNNER_TOKEN_FILE is set"},
		"opensandbox key":                      {map[string]string{"OPENSANDBOX_API_KEY_FILE": "/k"}, "OPENSANDBOX_API_KEY_FILE is set"},
		"bad trust domain":                     {map[string]string{"SPIFFE_TRUST_DOMAIN": "Not A Domain"}, "SPIFFE_TRUST_DOMAIN"},
		"bad health listen":                    {map[string]string{"HTTP_LISTEN": "9465"}, "HTTP_LISTEN"},
		"registration token":                   {map[string]string{"GITEA_RUNNER_REGISTRATION_TOKEN_FILE": "/t"}, "holds no forge"},
		"capability key":                       {map[string]string{"RUNNER_FACADE_CAPABILITY_KEY_FILE": "/k"}, "RUNNER_FACADE_CAPABILITY_KEY_FILE"},
		"task key":                             {map[string]string{"TASK_ENCRYPTION_KEY_FILE": "/k"}, "TASK_ENCRYPTION_KEY_FILE"},
		"nats password":                        {map[string]string{"NATS_PASSWORD_FILE": "/k"}, "NATS_PASSWORD_FILE"},
		"resync below a second":                {map[string]string{"IDENTITY_RESYNC": "10ms"}, "IDENTITY_RESYNC"},
		"facade parent without node selectors": {map[string]string{"IDENTITY_FACADE_SELECTORS": "k8s:sa:c", "IDENTITY_FACADE_PARENT_ID": "spiffe://dynrunner.local/facade-nodes"}, "go together"},
		"facade node selectors without parent": {map[string]string{"IDENTITY_FACADE_SELECTORS": "k8s:sa:c", "IDENTITY_FACADE_NODE_SELECTORS": "k8s_psat:cluster:x"}, "go together"},
		"facade parent without facade entry":   {map[string]string{"IDENTITY_FACADE_PARENT_ID": "spiffe://dynrunner.local/facade-nodes", "IDENTITY_FACADE_NODE_SELECTORS": "k8s_psat:cluster:x"}, "needs IDENTITY_FACADE_SELECTORS"},
		"facade parent other domain":           {map[string]string{"IDENTITY_FACADE_SELECTORS": "k8s:sa:c", "IDENTITY_FACADE_PARENT_ID": "spiffe://other.test/n", "IDENTITY_FACADE_NODE_SELECTORS": "k8s_psat:cluster:x"}, "not in trust domain"},
		"unknown source":                       {map[string]string{"IDENTITY_SOURCE": "nomad"}, "IDENTITY_SOURCE"},
		"relative docker socket":               {map[string]string{"IDENTITY_SOURCE": "docker", "IDENTITY_DOCKER_SOCKET": "docker.sock"}, "IDENTITY_DOCKER_SOCKET"},
		"bad docker scope":                     {map[string]string{"IDENTITY_SOURCE": "docker", "IDENTITY_DOCKER_SCOPE": "CI"}, "IDENTITY_DOCKER_SCOPE"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadIdentity(identityEnv(tc.env))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
