package main

import (
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/guest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/launcher"
)

const configurationDoc = "../../docs/configuration.md"

// docRow is one row of a variable table: its Default and Meaning cells.
type docRow struct{ def, meaning string }

// docSections reads the Markdown tables of configurationDoc under each "## " heading (a
// "### " subsection belongs to its section) and returns the rows whose first cell is a
// variable name in backticks, by section and name.
func docSections(t *testing.T) map[string]map[string]docRow {
	t.Helper()
	data, err := os.ReadFile(configurationDoc)
	require.NoError(t, err)
	sections := map[string]map[string]docRow{}
	section := ""
	for line := range strings.SplitSeq(string(data), "\n") {
		line = strings.TrimSpace(line)
		if h, ok := strings.CutPrefix(line, "## "); ok {
			section = strings.TrimSpace(h)
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if !strings.HasPrefix(line, "|") || !strings.HasPrefix(strings.TrimSpace(cells[0]), "`") {
			continue // not a table, or its header or separator row
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		require.Len(t, cells, 3, "%s, section %q: %s: want Variable | Default | Meaning", configurationDoc, section, line)
		name := strings.Trim(cells[0], "`")
		if sections[section] == nil {
			sections[section] = map[string]docRow{}
		}
		_, dup := sections[section][name]
		assert.False(t, dup, "%s, section %q: %s has two rows", configurationDoc, section, name)
		assert.NotEmpty(t, cells[2], "%s, section %q: %s has no meaning", configurationDoc, section, name)
		sections[section][name] = docRow{def: cells[1], meaning: cells[2]}
	}
	return sections
}

// A subcommand's configuration parser: what cmd calls with os.Getenv. It returns what it
// parsed, so that two runs can be compared.
type parser func(getenv func(string) string) (any, error)

// A scenario runs a parser on one environment. The environments are plausible settings that
// the parser accepts, together reaching every branch that reads a variable: each pod and VM
// backend, the embedded and an external NATS, each identity source.
type scenario struct {
	name string
	env  map[string]string
}

// subcommand is a subcommand's parser, its section of configurationDoc and its scenarios.
type subcommand struct {
	name, section string
	parse         parser
	scenarios     []scenario
}

// recorder is a getenv that answers from env and records every name it is asked for.
type recorder struct {
	env  map[string]string
	read map[string]bool
}

func (r *recorder) getenv(name string) string {
	r.read[name] = true
	return r.env[name]
}

// with returns a copy of base with kv (name, value, ...) set.
func with(base map[string]string, kv ...string) map[string]string {
	m := maps.Clone(base)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// file creates a file in dir holding content (mode 0600) and returns its path.
func file(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func controllerScenarios(t *testing.T) []scenario {
	dir := t.TempDir()
	key := file(t, dir, "key", strings.Repeat("k", 32))
	local := map[string]string{
		"STATE_DIR": dir, "GITEA_URL": "https://gitea.example", "GITEA_RUNNER_BIN": "/opt/gitea-runner",
		"GITEA_RUNNER_SHA256": strings.Repeat("ab", 32),
	}
	image := "registry.example/dynrunner/executor@sha256:" + strings.Repeat("1", 64)
	vm := with(local, "VM_IMAGE", "/srv/vm/base.qcow2", "VM_KERNEL", "/srv/vm/vmlinuz", "VM_INITRAMFS", "/srv/vm/initrd",
		"VM_HYPERVISOR", "qemu", "VM_EGRESS", "nat", "VM_DNS", "10.213.0.1")
	return []scenario{
		{"local pod backend, embedded NATS", local},
		{"docker pod backend", with(local, "POD_BACKEND", "docker", "POD_EXECUTOR_IMAGE", image)},
		{"kubernetes pod backend", with(local, "POD_BACKEND", "kubernetes", "POD_NAMESPACE", "ci", "POD_SPIFFE_CSI", "true",
			"SPIFFE_ENDPOINT_SOCKET", "unix:///run/spire/agent.sock", "RUNNER_FACADE_URL", "https://facade.dynrunner:8443",
			"POD_EXECUTOR_IMAGE", image)},
		{"external NATS", with(local, "NATS_URL", "nats://nats.example:4222", "NATS_USER", "dynrunner",
			"NATS_PASSWORD_FILE", key, "RUNNER_FACADE_CAPABILITY_KEY_FILE", key, "TASK_ENCRYPTION_KEY_FILE", key)},
		{"local vm backend", vm},
		{"opensandbox vm backend", with(local, "VM_BACKEND", "opensandbox", "OPENSANDBOX_URL", "https://sandbox.example",
			"OPENSANDBOX_API_KEY_FILE", key, "OPENSANDBOX_SANDBOX_CIDR", "10.50.0.0/16",
			"VM_NONCE_LISTEN", "10.0.0.5:7001", "RUNNER_FACADE_GUEST_LISTEN", "10.0.0.5:8444")},
	}
}

func executorScenarios(*testing.T) []scenario {
	c := executor.Config{
		FacadeURL: "https://127.0.0.1:8443", FacadeID: spiffeid.RequireFromString("spiffe://dynrunner.local/dynrunner/facade"),
		Task: 7, Epoch: 2, SecretsDir: "/envs/7-2/secrets", WorkDir: "/envs/7-2/work", ForgeURL: "https://gitea.example",
		Labels: executor.Labels(assignment.BackendPod), Renew: executor.DefaultRenew, LogFormat: executor.DefaultLogFormat,
		SpiffeEndpointSocket: "unix:///run/spire/agent.sock",
		RunnerBin:            "/opt/gitea-runner", RunnerSHA256: strings.Repeat("ab", 32), RunnerVersion: "v1.0.8",
	}
	gh := executor.GitHubConfig{Task: assignment.SlotBase + 7, Epoch: 2, SecretsDir: "/envs/7-2/secrets", WorkDir: "/envs/7-2/work",
		RunnerBin: "/opt/actions-runner/run.sh", RunnerSHA256: strings.Repeat("cd", 32), LogFormat: executor.DefaultLogFormat}
	return []scenario{{"a pod environment", c.Environ()}, {"a GitHub slot's environment", gh.Environ()}}
}

// parseExecutor is runExecutor's parsing: a GitHub slot's environment or a Gitea one.
func parseExecutor(g func(string) string) (any, error) {
	if executor.IsGitHub(g) {
		return executor.ParseGitHubEnv(g)
	}
	return executor.ParseEnv(g)
}

func launcherScenarios(t *testing.T) []scenario {
	dir := t.TempDir()
	id, err := launcher.ParseInstanceID("3f1c1b7e-2a4b-4c1d-9e8f-0a1b2c3d4e5f")
	require.NoError(t, err)
	nonce, err := launcher.ParseNonce(strings.Repeat("n", 32))
	require.NoError(t, err)
	ep, err := launcher.ParseEndpoint("http://10.213.0.1:7001")
	require.NoError(t, err)
	c := launcher.DefaultConfig()
	c.InstanceID, c.Nonce, c.Endpoint = id, nonce, ep
	c.Image, c.Kernel, c.Initramfs = file(t, dir, "base.qcow2", ""), file(t, dir, "vmlinuz", ""), file(t, dir, "initrd", "")
	c.Cmdline, c.Root = "console=ttyS0", filepath.Join(dir, "vms")
	return []scenario{{"direct kernel boot", c.Environ()}}
}

func guestScenarios(*testing.T) []scenario {
	return []scenario{{"seeded by a sandbox API", map[string]string{
		guest.EnvInstanceID: "3f1c1b7e-2a4b-4c1d-9e8f-0a1b2c3d4e5f", guest.EnvNonce: strings.Repeat("n", 32),
		guest.EnvEndpoint: "http://10.213.0.1:7001",
	}}}
}

func identityScenarios(*testing.T) []scenario {
	k8s := map[string]string{"POD_NAMESPACE": "ci", "IDENTITY_PARENT_ID": "spiffe://dynrunner.local/spire/agent/k8s_psat/ci"}
	return []scenario{
		{"kubernetes", k8s},
		{"kubernetes, facade entry on its own nodes", with(k8s, "IDENTITY_FACADE_SELECTORS", "k8s:ns:dynrunner",
			"IDENTITY_FACADE_PARENT_ID", "spiffe://dynrunner.local/facade-nodes", "IDENTITY_FACADE_NODE_SELECTORS", "k8s_psat:cluster:dynrunner")},
		{"docker", with(k8s, "IDENTITY_SOURCE", "docker", "POD_NAMESPACE", "")},
	}
}

func eventsScenarios(t *testing.T) []scenario {
	dir := t.TempDir()
	file(t, dir, embeddedPasswordFile, "secret")
	return []scenario{
		{"embedded NATS", map[string]string{"STATE_DIR": dir}},
		{"external NATS", map[string]string{"NATS_URL": "nats://nats.example:4222", "NATS_USER": "ops",
			"NATS_PASSWORD_FILE": filepath.Join(dir, embeddedPasswordFile)}},
	}
}

func statusScenarios(t *testing.T) []scenario {
	dir := t.TempDir()
	return []scenario{
		{"a controller's /status", nil},
		{"the fleet over NATS", map[string]string{"NATS_URL": "nats://nats.example:4222", "NATS_USER": "dynrunner-status",
			"NATS_PASSWORD_FILE": file(t, dir, "nats.password", "secret")}},
	}
}

// subcommands are every subcommand that reads the environment, with the parser cmd gives
// os.Getenv.
func subcommands(t *testing.T) []subcommand {
	return []subcommand{
		{"controller", "Controller variables", func(g func(string) string) (any, error) { return config.LoadController(g) }, controllerScenarios(t)},
		{"executor", "Executor variables", parseExecutor, executorScenarios(t)},
		{"launcher", "Launcher variables", func(g func(string) string) (any, error) { return parseLauncher(nil, g, io.Discard) }, launcherScenarios(t)},
		{"guest", "Guest variables", func(g func(string) string) (any, error) { return parseGuest(nil, g) }, guestScenarios(t)},
		{"identity", "Identity registrar variables", func(g func(string) string) (any, error) { return config.LoadIdentity(g) }, identityScenarios(t)},
		{"events", "Operator command variables", func(g func(string) string) (any, error) { return eventsNATSConfig(g) }, eventsScenarios(t)},
		{"status", "Operator command variables", func(g func(string) string) (any, error) { return statusSettings(g) }, statusScenarios(t)},
		{"drain", "Operator command variables", func(g func(string) string) (any, error) { return drainSettings(g) }, []scenario{{"defaults", nil}}},
		{"demo", "Operator command variables", func(g func(string) string) (any, error) { return demoCache(g), nil }, []scenario{{"defaults", nil}}},
	}
}

// TestDocsListEveryVariable runs every subcommand's configuration parser with a getenv that
// records what it reads, and checks docs/configuration.md against the record: every variable
// a parser reads has a row in its subcommand's section, and every row names a variable that
// section's parsers read.
func TestDocsListEveryVariable(t *testing.T) {
	docs := docSections(t)
	read := map[string]map[string]bool{} // by section
	for _, sc := range subcommands(t) {
		if read[sc.section] == nil {
			read[sc.section] = map[string]bool{}
		}
		for _, s := range sc.scenarios {
			r := &recorder{env: s.env, read: map[string]bool{}}
			_, err := sc.parse(r.getenv)
			require.NoError(t, err, "%s, %s: the scenario must be a configuration the parser accepts", sc.name, s.name)
			maps.Copy(read[sc.section], r.read)
			for name := range r.read {
				_, ok := docs[sc.section][name]
				assert.True(t, ok, "`dynrunner %s` reads %s, which %s does not list in section %q", sc.name, name, configurationDoc, sc.section)
			}
		}
	}
	for _, section := range slices.Sorted(maps.Keys(docs)) {
		for name := range docs[section] {
			assert.True(t, read[section][name], "%s, section %q, lists %s, which no parser of that section reads", configurationDoc, section, name)
		}
	}
}

// TestDocsDefaults checks the Default column against the parsers. A parser does not expose
// its defaults by name (they are arguments of its reads, or computed from other settings), and
// a list of them kept beside the parser would be the hand-kept list this test replaces. So
// the test asks the parser itself: a documented default given explicitly must parse to what
// the parser makes of the variable unset, in at least one scenario that reads it (some
// defaults hold for one backend only: VM_EGRESS=none is refused with opensandbox). Defaults
// written as prose or computed (`<...>`, `$HOME`, "(when ...)") are not checked; "—" (empty)
// is trivially right.
func TestDocsDefaults(t *testing.T) {
	docs := docSections(t)
	for _, sc := range subcommands(t) {
		for name, row := range docs[sc.section] {
			def, ok := literalDefault(row.def)
			if !ok {
				continue
			}
			var tried []string
			agrees := false
			for _, s := range sc.scenarios {
				r := &recorder{env: s.env, read: map[string]bool{}}
				if _, err := sc.parse(r.getenv); err != nil || !r.read[name] {
					continue
				}
				unset := maps.Clone(s.env)
				if unset == nil {
					unset = map[string]string{}
				}
				delete(unset, name)
				explicit := with(unset, name, def)
				want, wantErr := sc.parse(func(k string) string { return unset[k] })
				got, gotErr := sc.parse(func(k string) string { return explicit[k] })
				if assert.ObjectsAreEqual(want, got) && errText(wantErr) == errText(gotErr) {
					agrees = true
					break
				}
				tried = append(tried, s.name)
			}
			assert.True(t, agrees || len(tried) == 0, "`dynrunner %s`: %s=%s, its documented default, parses unlike %s unset (scenarios %q)",
				sc.name, name, def, name, tried)
		}
	}
}

// literalDefault returns the value of a Default cell that is exactly one literal in
// backticks.
func literalDefault(cell string) (string, bool) {
	v, ok := strings.CutPrefix(cell, "`")
	if !ok || !strings.HasSuffix(v, "`") {
		return "", false
	}
	v = strings.TrimSuffix(v, "`")
	if v == "" || strings.ContainsAny(v, "`<$") {
		return "", false
	}
	return v, true
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
