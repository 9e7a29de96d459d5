package grants

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

const (
	pod = assignment.BackendPod
	vm  = assignment.BackendVM
)

const policy = `
default: [pod]
owners:
  Acme: [pod, vm]
  contractors: [vm]
  frozen: []
repositories:
  acme/untrusted-plugins: [vm]
  contractors/docs: [pod, vm]
forks: [vm]
`

// TestGrantRules: one row per rule of the policy, and for the order they apply in.
func TestGrantRules(t *testing.T) {
	p, err := Parse([]byte(policy))
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		s       Subject
		rule    string
		allowed []assignment.Backend
	}{
		{"owner rule", Subject{Repo: "acme/site"}, `owners["acme"]`, []assignment.Backend{pod, vm}},
		{"names compare without case", Subject{Repo: "ACME/Site"}, `owners["acme"]`, []assignment.Backend{pod, vm}},
		{"repository rule beats its owner's", Subject{Repo: "acme/untrusted-plugins"}, `repositories["acme/untrusted-plugins"]`, []assignment.Backend{vm}},
		{"vm-only owner", Subject{Repo: "contractors/app"}, `owners["contractors"]`, []assignment.Backend{vm}},
		{"repository rule widens a vm-only owner", Subject{Repo: "contractors/docs"}, `repositories["contractors/docs"]`, []assignment.Backend{pod, vm}},
		{"an empty list grants nothing", Subject{Repo: "frozen/x"}, `owners["frozen"]`, nil},
		{"default for owners no rule names", Subject{Repo: "someone/else"}, "default", []assignment.Backend{pod}},
		{"a job without a repository falls to default", Subject{}, "default", []assignment.Backend{pod}},
		{"forks narrow the owner's rule", Subject{Repo: "acme/site", Fork: true}, `owners["acme"] and forks`, []assignment.Backend{vm}},
		{"forks narrow default to nothing", Subject{Repo: "someone/else", Fork: true}, "default and forks", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := p.For(tc.s)
			assert.Equal(t, tc.rule, g.Rule)
			assert.ElementsMatch(t, tc.allowed, g.Tiers)
			for _, tier := range []assignment.Backend{pod, vm} {
				err := p.Check(tc.s, tier)
				if assert.Equal(t, g.Allows(tier), err == nil, "tier %s: %v", tier, err) && err != nil {
					assert.ErrorIs(t, err, ErrNotGranted)
					assert.Contains(t, err.Error(), "grant "+tc.rule+" of GRANTS_FILE")
				}
			}
		})
	}
}

// TestVMOnlyOwnersPodJob is the refusal a vm-only owner's `[self-hosted, pod]` job gets: it
// names the grant, and what the job can ask for instead.
func TestVMOnlyOwnersPodJob(t *testing.T) {
	p, err := Parse([]byte(policy))
	require.NoError(t, err)
	err = p.Check(Subject{Repo: "contractors/app"}, pod)
	require.ErrorIs(t, err, ErrNotGranted)
	assert.EqualError(t, err, `isolation tier not granted: the job asks for pod, but grant owners["contractors"] of GRANTS_FILE allows repository contractors/app only [vm]; use runs-on: [self-hosted, vm]`)
	require.NoError(t, p.Check(Subject{Repo: "contractors/app"}, vm))

	err = p.Check(Subject{Repo: "frozen/x"}, vm)
	assert.EqualError(t, err, `isolation tier not granted: the job asks for vm, but grant owners["frozen"] of GRANTS_FILE allows repository frozen/x no tier`)
}

// TestNoPolicyGrantsEverything: without GRANTS_FILE, and with a file that names no rule for
// a subject, every tier is granted (dynrunner's behaviour without grants).
func TestNoPolicyGrantsEverything(t *testing.T) {
	var none *Policy
	for _, tier := range []assignment.Backend{pod, vm} {
		require.NoError(t, none.Check(Subject{Repo: "a/b", Fork: true}, tier))
	}
	p, err := Parse([]byte("owners:\n  acme: [vm]\n"))
	require.NoError(t, err)
	assert.Equal(t, "no rule", p.For(Subject{Repo: "other/x"}).Rule)
	require.NoError(t, p.Check(Subject{Repo: "other/x", Fork: true}, pod), "no forks bound: forks are not narrowed")
}

// TestParseRefuses: a policy that could mean something else than its author meant fails
// closed, saying what is wrong.
func TestParseRefuses(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", "owner:\n  acme: [vm]\n", "field owner not found"},
		{"unknown tier", "owners:\n  acme: [container]\n", `owners["acme"]: tier "container": want pod or vm`},
		{"owner with a slash", "owners:\n  acme/site: [vm]\n", `"acme/site" is not an owner name`},
		{"repository without owner", "repositories:\n  site: [vm]\n", `"site" is not owner/name`},
		{"repository with two slashes", "repositories:\n  a/b/c: [vm]\n", `"a/b/c" is not owner/name`},
		{"a name twice in two cases", "owners:\n  acme: [vm]\n  ACME: [pod]\n", "named twice"},
		{"tiers not a list", "default: pod\n", "cannot unmarshal"},
		{"bad default tier", "default: [pod, microvm]\n", `default: tier "microvm"`},
		{"bad forks tier", "forks: [vms]\n", `forks: tier "vms"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			require.ErrorIs(t, err, ErrPolicy)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "grants.yaml")
	require.NoError(t, os.WriteFile(path, []byte(policy), 0o600))
	p, err := Load(path)
	require.NoError(t, err)
	assert.Equal(t, `owners["contractors"]`, p.For(Subject{Repo: "contractors/x"}).Rule)

	_, err = Load(filepath.Join(dir, "missing.yaml"))
	require.ErrorIs(t, err, ErrPolicy)

	big := filepath.Join(dir, "big.yaml")
	require.NoError(t, os.WriteFile(big, make([]byte, maxFileSize+1), 0o600))
	_, err = Load(big)
	require.ErrorIs(t, err, ErrPolicy)
	assert.Contains(t, err.Error(), "larger than")
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(policy))
	f.Add([]byte("forks: []\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			require.ErrorIs(t, err, ErrPolicy)
			return
		}
		// Whatever parsed, a decision is one of the tiers, and Check agrees with For.
		for _, s := range []Subject{{Repo: "acme/site"}, {Repo: "x/y", Fork: true}, {}} {
			g := p.For(s)
			for _, tier := range g.Tiers {
				require.Contains(t, []assignment.Backend{pod, vm}, tier)
				require.NoError(t, p.Check(s, tier))
			}
		}
	})
}
