package config

import (
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/dynrunner/dynrunner/forge/github"
)

// GitHub configures the second forge: GitHub workflows served through runner scale sets, one
// per tier (forge/github). It is off unless GITHUB_CONFIG_URL is set.
type GitHub struct {
	// URL is GITHUB_CONFIG_URL: the organisation, repository or enterprise whose scale sets
	// dynrunner keeps, e.g. https://github.com/acme.
	URL  string
	Auth github.Auth
	// CAFile is GITHUB_CA_FILE: a PEM bundle, the only CAs trusted for GitHub (GitHub
	// Enterprise Server with a private CA); empty trusts the system's.
	CAFile string
	// RunnerGroup is GITHUB_RUNNER_GROUP, the scale sets' runner group.
	RunnerGroup string
	// ScaleSetPrefix is GITHUB_SCALE_SET_PREFIX: the scale sets are <prefix>-pod and
	// <prefix>-vm.
	ScaleSetPrefix string
	// Idle is GITHUB_IDLE_SECS: how long a slot's runner waits for GitHub to give it a job
	// before it is removed (a slot's pickup deadline).
	Idle time.Duration
	// JobLease is GITHUB_JOB_LEASE_SECS: the longest a slot's job may run (a slot is not
	// renewed).
	JobLease time.Duration
	// RunnerBin is GITHUB_RUNNER_BIN: the pinned GitHub Actions runner's run.sh as the
	// environments see it; RunnerSHA256 (GITHUB_RUNNER_SHA256) its SHA-256. The workers need
	// them.
	RunnerBin    string
	RunnerSHA256 string
	// VMRunnerBin is GITHUB_VM_RUNNER_BIN: the pinned GitHub Actions runner's run.sh in the
	// microVM guest image (DefaultVMRunnerBin); VMRunnerSHA256 (GITHUB_VM_RUNNER_SHA256, by
	// default GITHUB_RUNNER_SHA256) its SHA-256. The vm worker grants them to GitHub slots'
	// guests.
	VMRunnerBin    string
	VMRunnerSHA256 string
	// Reruns is GITHUB_RERUNS: how many times dynrunner asks GitHub to rerun the failed jobs
	// of one workflow run whose slots lost their environment (0: never).
	Reruns int
}

// Enabled reports whether GitHub is configured: a scheduler serves its scale sets.
func (g GitHub) Enabled() bool { return g.URL != "" }

// Slots reports whether a worker serves GitHub slots: it has the runner's pin. A worker in a
// process of its own needs nothing else of GitHub, no credential in particular.
func (g GitHub) Slots() bool { return g.RunnerBin != "" }

// VMSlots reports whether the vm worker serves GitHub slots: it has the pin of the runner in
// the guest image.
func (g GitHub) VMSlots() bool { return g.VMRunnerBin != "" && g.VMRunnerSHA256 != "" }

// GitHub defaults.
const (
	DefaultGitHubIdle     = 10 * time.Minute
	DefaultScaleSetPrefix = "dynrunner"
	// DefaultVMRunnerBin is where deploy/vm-image/build.sh puts GitHub's runner (GITHUB_RUNNER_DIR).
	DefaultVMRunnerBin = "/opt/actions-runner/run.sh"
)

// loadGitHub reads the GITHUB_* variables. Credentials are named by file only; which files
// exist and hold a key is checked when the clients are made (forge/github.NewClients), at boot.
func loadGitHub(e *env, c Controller) GitHub {
	g := GitHub{URL: e.str("GITHUB_CONFIG_URL", "")}
	appID, _ := e.lookup("GITHUB_APP_ID")
	g.Auth = github.Auth{
		AppID:          appID,
		PrivateKeyFile: e.str("GITHUB_APP_PRIVATE_KEY_FILE", ""),
		TokenFile:      e.str("GITHUB_TOKEN_FILE", ""),
	}
	if v, ok := e.lookup("GITHUB_APP_INSTALLATION_ID"); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			e.fail("GITHUB_APP_INSTALLATION_ID=%q: want the App installation's positive numeric id (in the installation's settings URL)", v)
		}
		g.Auth.InstallationID = n
	}
	g.CAFile = e.str("GITHUB_CA_FILE", "")
	g.RunnerGroup = e.str("GITHUB_RUNNER_GROUP", github.DefaultRunnerGroup)
	g.ScaleSetPrefix = e.str("GITHUB_SCALE_SET_PREFIX", DefaultScaleSetPrefix)
	g.Idle = e.seconds("GITHUB_IDLE_SECS", int(DefaultGitHubIdle/time.Second), 30)
	g.JobLease = e.seconds("GITHUB_JOB_LEASE_SECS", int(github.DefaultSlotLease/time.Second), 60)
	g.RunnerBin = e.str("GITHUB_RUNNER_BIN", "")
	g.RunnerSHA256 = strings.ToLower(e.str("GITHUB_RUNNER_SHA256", ""))
	g.VMRunnerBin = e.str("GITHUB_VM_RUNNER_BIN", DefaultVMRunnerBin)
	g.VMRunnerSHA256 = strings.ToLower(e.str("GITHUB_VM_RUNNER_SHA256", g.RunnerSHA256))
	g.Reruns = e.integer("GITHUB_RERUNS", github.DefaultReruns, 0)
	if g.Reruns > github.MaxReruns {
		e.fail("GITHUB_RERUNS=%d: want at most %d reruns of a workflow run (0 turns reruns off)", g.Reruns, github.MaxReruns)
	}
	worker := c.Has(PodWorker) || c.Has(VMWorker)
	if worker && g.RunnerBin != "" && !sha256Hex(g.RunnerSHA256) {
		e.fail("GITHUB_RUNNER_SHA256 must be the 64-hex-digit SHA-256 of GITHUB_RUNNER_BIN (sha256sum %s)", g.RunnerBin)
	}
	if c.Has(VMWorker) && g.VMRunnerSHA256 != "" {
		switch {
		case !sha256Hex(g.VMRunnerSHA256):
			e.fail("GITHUB_VM_RUNNER_SHA256 must be the 64-hex-digit SHA-256 of GITHUB_VM_RUNNER_BIN in the guest image (sha256sum %s in the image; default GITHUB_RUNNER_SHA256)", g.VMRunnerBin)
		case !strings.HasPrefix(g.VMRunnerBin, "/"):
			e.fail("GITHUB_VM_RUNNER_BIN=%q: want the absolute path of the runner's run.sh in the guest image (default %s)", g.VMRunnerBin, DefaultVMRunnerBin)
		}
	}
	// Only a scheduler talks to GitHub. A worker serves slots when it has the runner's pin
	// (GitHub.Slots), and needs no credential: the App key and tokens stay off its host.
	switch {
	case !g.Enabled() && g.Auth != (github.Auth{}):
		e.fail("GITHUB_APP_* or GITHUB_TOKEN_FILE is set without GITHUB_CONFIG_URL: name the organisation, repository or enterprise (e.g. https://github.com/acme), or unset them")
	case !c.Has(Scheduler) && g.Auth != (github.Auth{}):
		e.fail("GITHUB_APP_* or GITHUB_TOKEN_FILE is set in a process without the scheduler (COMPONENTS=%s): only the scheduler talks to GitHub; keep the App key and tokens off this host", strings.Join(c.Components, ","))
	}
	if !g.Enabled() || !c.Has(Scheduler) {
		return g
	}
	if u, err := url.Parse(g.URL); err != nil || (u.Scheme != "https" && (u.Scheme != "http" || !loopbackHost(u.Hostname()))) ||
		u.Host == "" || u.User != nil || u.RawQuery != "" {
		e.fail("GITHUB_CONFIG_URL=%q: want https://<host>/<org>[/<repo>] or https://<host>/enterprises/<name> (http only for a loopback host, in development)", g.URL)
	}
	if err := g.Auth.Validate(); err != nil {
		e.fail("%v", err)
	}
	if c.Has(PodWorker) && g.RunnerBin == "" {
		e.fail("GITHUB_RUNNER_BIN is required with GitHub and a worker in one process: the pinned GitHub Actions runner's run.sh as environments see it (scripts/github-runner.sh)")
	}
	if c.Has(VMWorker) && !g.VMSlots() {
		e.fail("GITHUB_VM_RUNNER_SHA256 (or GITHUB_RUNNER_SHA256) is required with GitHub and the vm worker in one process: the SHA-256 of the GitHub Actions runner's run.sh in the guest image (GITHUB_VM_RUNNER_BIN, default %s)", DefaultVMRunnerBin)
	}
	if g.Idle >= g.JobLease {
		e.fail("GITHUB_IDLE_SECS (%s) must be below GITHUB_JOB_LEASE_SECS (%s)", g.Idle, g.JobLease)
	}
	return g
}

// sha256Hex reports whether s is a SHA-256 in lower-case hex.
func sha256Hex(s string) bool {
	return len(s) == 64 && strings.Trim(s, "0123456789abcdef") == ""
}

// loopbackHost reports whether host is a loopback address or localhost.
func loopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
