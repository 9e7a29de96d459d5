package config

import (
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	require.NoError(t, err)
	assert.Equal(t, "/tmp/spire-server/private/api.sock", c.ServerSocket)
	assert.Equal(t, "k8s", c.Selectors)
	assert.Equal(t, 10*time.Minute, c.SVIDTTL)
	assert.Equal(t, 30*time.Second, c.Resync)
	assert.Equal(t, "127.0.0.1:9465", c.HTTPListen)
	assert.Equal(t, "dynrunner.local", c.TrustDomain.Name())
	assert.Equal(t, "spiffe://dynrunner.local/dynrunner/nodes", c.ParentID.String())
	assert.Empty(t, c.NodeAliasSelectors)
	c, err = LoadIdentity(identityEnv(map[string]string{
		"SPIRE_SERVER_SOCKET":           "unix:///run/spire/api.sock",
		"IDENTITY_NODE_ALIAS_SELECTORS": "k8s_psat:cluster:dynrunner, k8s_psat:agent_ns:spire",
		"IDENTITY_SELECTORS":            "docker",
	}))
	require.NoError(t, err)
	assert.Equal(t, "/run/spire/api.sock", c.ServerSocket)
	assert.Equal(t, "docker", c.Selectors)
	assert.Equal(t, []string{"k8s_psat:cluster:dynrunner", "k8s_psat:agent_ns:spire"}, c.NodeAliasSelectors)
	assert.Equal(t, "kubernetes", c.Source, "the default source")
	// The docker source needs no namespace.
	c, err = LoadIdentity(identityEnv(map[string]string{"IDENTITY_SOURCE": "docker", "POD_NAMESPACE": ""}))
	require.NoError(t, err)
	assert.Equal(t, "docker", c.Source)
	assert.Equal(t, "/var/run/docker.sock", c.DockerSocket)
	assert.Equal(t, "default", c.DockerScope)
	c, err = LoadIdentity(identityEnv(map[string]string{"IDENTITY_SOURCE": "docker",
		"IDENTITY_DOCKER_SOCKET": "unix:///run/docker.sock", "IDENTITY_DOCKER_SCOPE": "ci2"}))
	require.NoError(t, err)
	assert.Equal(t, "/run/docker.sock", c.DockerSocket)
	assert.Equal(t, "ci2", c.DockerScope)
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
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestSpiffeIDIn(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("dynrunner.test")
	tests := []struct {
		name    string
		value   string
		td      spiffeid.TrustDomain
		want    string // the ID, "" for the zero one
		set     bool
		wantErr string
	}{
		{name: "unset", value: "", td: td},
		{name: "blank is unset", value: "  ", td: td},
		{name: "member", value: "spiffe://dynrunner.test/a", td: td, want: "spiffe://dynrunner.test/a", set: true},
		{name: "any trust domain when none", value: "spiffe://other.test/a", want: "spiffe://other.test/a", set: true},
		{name: "other trust domain", value: "spiffe://other.test/a", td: td, set: true, wantErr: `X="spiffe://other.test/a" is not in trust domain dynrunner.test`},
		{name: "malformed", value: "https://dynrunner.test/a", td: td, set: true, wantErr: `X="https://dynrunner.test/a": `},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &env{get: func(string) string { return tt.value }}
			id, set := e.spiffeIDIn("X", tt.td)
			assert.Equal(t, tt.set, set, "set")
			if tt.want == "" {
				assert.True(t, id.IsZero(), "id %s", id)
			} else {
				assert.Equal(t, tt.want, id.String())
			}
			if tt.wantErr == "" {
				assert.Empty(t, e.errs)
			} else {
				require.Len(t, e.errs, 1)
				assert.ErrorContains(t, e.errs[0], tt.wantErr)
			}
		})
	}
}
