// Package grants is the isolation policy of GRANTS_FILE: which isolation tiers (pod, vm) the
// jobs of each repository owner and repository may use, and a bound for pull requests from
// forks. The scheduler checks a job's tier against it before claiming, and every worker checks
// the assignment again before it starts an environment (defence in depth). No policy (no file)
// grants every tier, which is dynrunner's behaviour without grants.
//
// The file is YAML:
//
//	default: [pod, vm]          # owners and repositories no rule names (omitted: every tier)
//	owners:
//	  acme: [pod, vm]
//	  contractors: [vm]         # vm only: their pod jobs fail, naming this grant
//	repositories:
//	  acme/untrusted-plugins: [vm]
//	forks: [vm]                 # pull requests from forks: at most these tiers
//
// A repository rule beats its owner's rule, which beats default. The forks bound narrows
// whatever the rule grants. Names compare case-insensitively, as the forge's do. An empty list
// grants nothing.
package grants

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// ErrNotGranted: the job's tier is not among the tiers its grant allows.
var ErrNotGranted = errors.New("isolation tier not granted")

// ErrPolicy: the policy file is unreadable or invalid.
var ErrPolicy = errors.New("grants policy")

// maxFileSize bounds the policy file read at boot.
const maxFileSize = 1 << 20

// Policy is a parsed GRANTS_FILE. A nil *Policy grants every tier.
type Policy struct {
	def          []assignment.Backend
	hasDefault   bool
	owners       map[string][]assignment.Backend
	repositories map[string][]assignment.Backend
	forks        []assignment.Backend
	hasForks     bool
}

// Subject is what a grant is decided for: the job's repository ("owner/name") and whether it
// runs for a pull request from a fork.
type Subject struct {
	Repo string
	Fork bool
}

// Grant is the rule that decides a subject's tiers, and the tiers it allows.
type Grant struct {
	// Rule names the rule as the file writes it: `repositories["acme/site"]`,
	// `owners["acme"]`, `default`, or `no rule` when the policy names none; ` and forks` is
	// added when the forks bound narrowed it.
	Rule  string
	Tiers []assignment.Backend
}

// Allows reports whether g allows tier.
func (g Grant) Allows(tier assignment.Backend) bool { return slices.Contains(g.Tiers, tier) }

// Load reads and parses the policy file at path. The file's name goes into refusals
// (GRANTS_FILE's base name), never its content.
func Load(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	defer f.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(io.LimitReader(f, maxFileSize+1)); err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrPolicy, path, err)
	}
	if buf.Len() > maxFileSize {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrPolicy, path, maxFileSize)
	}
	p, err := Parse(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// file is the YAML form of a policy.
type file struct {
	Default      *[]string           `yaml:"default"`
	Owners       map[string][]string `yaml:"owners"`
	Repositories map[string][]string `yaml:"repositories"`
	Forks        *[]string           `yaml:"forks"`
}

// Parse parses a policy. Unknown keys, unknown tiers, malformed names and a name written twice
// (in any case) are errors: a policy that says something else than its author meant fails
// closed at boot.
func Parse(data []byte) (*Policy, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: the file is empty; name at least one of default, owners, repositories, forks", ErrPolicy)
	} else if err != nil {
		return nil, fmt.Errorf("%w: %w (keys: default, owners, repositories, forks)", ErrPolicy, err)
	}
	p := &Policy{owners: map[string][]assignment.Backend{}, repositories: map[string][]assignment.Backend{}}
	var err error
	if f.Default != nil {
		p.hasDefault = true
		if p.def, err = tiers("default", *f.Default); err != nil {
			return nil, err
		}
	}
	if f.Forks != nil {
		p.hasForks = true
		if p.forks, err = tiers("forks", *f.Forks); err != nil {
			return nil, err
		}
	}
	for name, list := range f.Owners {
		if name == "" || strings.ContainsAny(name, "/ \t") {
			return nil, fmt.Errorf("%w: owners: %q is not an owner name (a user or organisation, without /)", ErrPolicy, name)
		}
		if err := put(p.owners, "owners", name, list); err != nil {
			return nil, err
		}
	}
	for name, list := range f.Repositories {
		owner, repo, ok := strings.Cut(name, "/")
		if !ok || owner == "" || repo == "" || strings.ContainsAny(repo, "/ \t") || strings.ContainsAny(owner, " \t") {
			return nil, fmt.Errorf("%w: repositories: %q is not owner/name", ErrPolicy, name)
		}
		if err := put(p.repositories, "repositories", name, list); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func put(m map[string][]assignment.Backend, section, name string, list []string) error {
	key := strings.ToLower(name)
	if _, dup := m[key]; dup {
		return fmt.Errorf("%w: %s: %q is named twice (names compare without case)", ErrPolicy, section, name)
	}
	t, err := tiers(fmt.Sprintf("%s[%q]", section, name), list)
	if err != nil {
		return err
	}
	m[key] = t
	return nil
}

func tiers(where string, list []string) ([]assignment.Backend, error) {
	out := []assignment.Backend{}
	for _, s := range list {
		b, err := assignment.ParseBackend(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%w: %s: tier %q: want pod or vm", ErrPolicy, where, s)
		}
		if !slices.Contains(out, b) {
			out = append(out, b)
		}
	}
	return out, nil
}

// every is what no rule restricts.
var every = []assignment.Backend{assignment.BackendPod, assignment.BackendVM}

// For returns the grant that decides s.
func (p *Policy) For(s Subject) Grant {
	if p == nil {
		return Grant{Rule: "no policy", Tiers: every}
	}
	repo := strings.ToLower(strings.TrimSpace(s.Repo))
	owner, _, _ := strings.Cut(repo, "/")
	var g Grant
	if t, ok := p.repositories[repo]; ok && repo != "" {
		g = Grant{Rule: fmt.Sprintf("repositories[%q]", repo), Tiers: t}
	} else if t, ok := p.owners[owner]; ok && owner != "" {
		g = Grant{Rule: fmt.Sprintf("owners[%q]", owner), Tiers: t}
	} else if p.hasDefault {
		g = Grant{Rule: "default", Tiers: p.def}
	} else {
		g = Grant{Rule: "no rule", Tiers: every}
	}
	if s.Fork && p.hasForks {
		var narrowed []assignment.Backend
		for _, t := range g.Tiers {
			if slices.Contains(p.forks, t) {
				narrowed = append(narrowed, t)
			}
		}
		g = Grant{Rule: g.Rule + " and forks", Tiers: narrowed}
	}
	return g
}

// Check returns nil when s may run on tier, and otherwise an ErrNotGranted whose message names
// the grant and what the job can do instead; it goes into the job's log.
func (p *Policy) Check(s Subject, tier assignment.Backend) error {
	g := p.For(s)
	if g.Allows(tier) {
		return nil
	}
	who := "repository " + s.Repo
	if s.Repo == "" {
		who = "a job without a repository"
	}
	if s.Fork {
		who += " (a pull request from a fork)"
	}
	allowed := "no tier"
	if len(g.Tiers) > 0 {
		var names []string
		for _, t := range g.Tiers {
			names = append(names, string(t))
		}
		allowed = "only [" + strings.Join(names, ", ") + "]"
	}
	msg := fmt.Sprintf("the job asks for %s, but grant %s of GRANTS_FILE allows %s %s", tier, g.Rule, who, allowed)
	if len(g.Tiers) > 0 {
		msg += fmt.Sprintf("; use runs-on: [self-hosted, %s]", g.Tiers[0])
	}
	return fmt.Errorf("%w: %s", ErrNotGranted, msg)
}
