package executor

import (
	"net/url"
	"strings"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// runnerPlan is how the runner reaches the forge and what its process and its jobs see.
type runnerPlan struct {
	// address is the runner's registered address: the server URL its jobs see.
	address string
	// forwarded: the address is the executor's forwarder (a loopback forge, or none known).
	forwarded bool
	// insecure: the runner skips verifying TLS to the forge's host, which it reaches only
	// through the proxy on loopback (runner.insecure applies to the forge's host alone).
	insecure bool
	// env is the runner process's environment.
	env []string
	// jobEnv restores for the jobs what env changed (runner.envs in the runner's config).
	jobEnv map[string]string
	// home is the HOME the executor made up for an environment without one, to create.
	home string
}

// proxyKeys are the variables that could steer the runner past its proxy or that Go reads
// beside HTTP(S)_PROXY: the runner's process goes without them, its jobs get them back.
var proxyKeys = []string{"NO_PROXY", "no_proxy", "REQUEST_METHOD"}

// planRunner decides the runner's address and environment. A known forge that the runner can
// reach through a proxy (any non-loopback host) is the runner's address, so the job sees the
// forge's own URL in server_url and every link; the runner's process alone gets the proxy in
// HTTP_PROXY or HTTPS_PROXY. Otherwise the runner is registered with the forwarder.
func planRunner(forge assignment.ForgeURL, px *proxy, base []string, home string) runnerPlan {
	env := ownEnvRemoved(base)
	plan := runnerPlan{jobEnv: map[string]string{}}
	if _, ok := lookupEnv(env, "HOME"); !ok {
		env = append(env, "HOME="+home)
		plan.home = home
	}
	var u *url.URL
	if forge != "" {
		u = forge.URL()
	}
	if u == nil || isLoopback(u) {
		plan.address, plan.forwarded = px.URL(), true
		plan.env = env
		return plan
	}
	plan.address = forge.String()
	key := "HTTP_PROXY"
	if u.Scheme == "https" {
		key, plan.insecure = "HTTPS_PROXY", true
	}
	for _, k := range append([]string{key}, proxyKeys...) {
		v, ok := lookupEnv(env, k)
		if ok || k == key {
			plan.jobEnv[k] = v
		}
		env = withoutKey(env, k)
	}
	plan.env = append(env, key+"="+px.ProxyURL())
	return plan
}

// ownEnvRemoved drops the executor's own configuration from env: the job must not see it.
// EnvEnvDir stays: the local backend finds every process of an environment by it.
func ownEnvRemoved(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == EnvEnvDir:
		case strings.HasPrefix(k, "DYNRUNNER_"), strings.HasPrefix(k, "GITEA_RUNNER_"),
			k == EnvSpiffeSocket, k == EnvLogFormat:
			continue
		}
		out = append(out, kv)
	}
	return out
}

func lookupEnv(env []string, key string) (string, bool) {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

func withoutKey(env []string, key string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k != key {
			out = append(out, kv)
		}
	}
	return out
}
