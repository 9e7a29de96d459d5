package executor

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// recorder is a server that answers who it is and remembers what it was asked.
type recorder struct {
	name string
	mu   sync.Mutex
	reqs []*http.Request
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec.mu.Lock()
	rec.reqs = append(rec.reqs, r.Clone(r.Context()))
	rec.mu.Unlock()
	_, _ = io.WriteString(w, rec.name+" "+r.URL.Path)
}

func (rec *recorder) last(t *testing.T) *http.Request {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.NotEmpty(t, rec.reqs, "%s was not asked", rec.name)
	return rec.reqs[len(rec.reqs)-1]
}

func (rec *recorder) count() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return len(rec.reqs)
}

// bed is a proxy between a facade and a forge, both recorders.
type bed struct {
	px            *proxy
	facade, forge *recorder
	facadeSrv     *httptest.Server
	forgeSrv      *httptest.Server
	forgeURL      *url.URL
}

func pool(srvs ...*httptest.Server) *x509.CertPool {
	p := x509.NewCertPool()
	for _, s := range srvs {
		p.AddCert(s.Certificate())
	}
	return p
}

// newBed starts the servers and the proxy. forgeTLS makes the forge https; forgePath is the
// path Gitea is served below. trustForge lets the proxy's upstream verify the forge.
func newBed(t *testing.T, forgeTLS bool, forgePath string, trustForge bool) *bed {
	t.Helper()
	b := &bed{facade: &recorder{name: "facade"}, forge: &recorder{name: "forge"}}
	b.facadeSrv = httptest.NewTLSServer(b.facade)
	t.Cleanup(b.facadeSrv.Close)
	if forgeTLS {
		b.forgeSrv = httptest.NewTLSServer(b.forge)
	} else {
		b.forgeSrv = httptest.NewServer(b.forge)
	}
	t.Cleanup(b.forgeSrv.Close)
	fu, err := assignment.ParseForgeURL(b.forgeSrv.URL + forgePath)
	require.NoError(t, err)
	b.forgeURL = fu.URL()
	facade, _ := url.Parse(b.facadeSrv.URL)
	up := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}
	if trustForge && forgeTLS {
		up.TLSClientConfig.RootCAs = pool(b.forgeSrv)
	}
	b.px, err = startProxy(proxyConfig{
		Facade:          facade,
		FacadeTransport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool(b.facadeSrv)}},
		Forge:           b.forgeURL, Upstream: up, Log: zerolog.Nop(),
	})
	require.NoError(t, err)
	t.Cleanup(b.px.Close)
	return b
}

// runnerClient is an HTTP client configured as the Gitea runner's is inside an environment:
// the proxy from its environment, and (runner.insecure) no verification of the forge's host.
func (b *bed) runnerClient(proxyURL string) *http.Client {
	pu, _ := url.Parse(proxyURL)
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
}

func get(t *testing.T, c *http.Client, u string, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestProxyRoutesTheRunnerAPIToTheFacade(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
		path string
	}{
		{"http forge", false, ""},
		{"https forge", true, ""},
		{"https forge below a path", true, "/gitea"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBed(t, tc.tls, tc.path, true)
			c := b.runnerClient(b.px.ProxyURL())
			base := b.forgeURL.String()

			code, body := get(t, c, base+"/api/actions/runner.v1.RunnerService/FetchTask", map[string]string{"x-runner-uuid": "u1"})
			require.Equal(t, http.StatusOK, code, body)
			assert.Equal(t, "facade /api/actions/runner.v1.RunnerService/FetchTask", body)
			assert.Equal(t, "u1", b.facade.last(t).Header.Get("x-runner-uuid"))
			assert.Empty(t, b.facade.last(t).Header.Get("Proxy-Authorization"), "the proxy credentials go no further")

			// Everything else the runner asks of the forge's host (action clones) goes to the
			// forge, with what the runner sent and nothing added.
			code, body = get(t, c, base+"/owner/action.git/info/refs", map[string]string{"Authorization": "Basic am9iOnRva2Vu"})
			require.Equal(t, http.StatusOK, code, body)
			assert.Equal(t, "forge "+tc.path+"/owner/action.git/info/refs", body)
			got := b.forge.last(t)
			assert.Equal(t, "Basic am9iOnRva2Vu", got.Header.Get("Authorization"))
			assert.Empty(t, got.Header.Get("Proxy-Authorization"))
			assert.Empty(t, got.Header.Get("X-Forwarded-For"))
			assert.Empty(t, got.Header.Get("x-runner-token"))
			assert.Equal(t, 1, b.facade.count(), "the facade saw only the runner API")
		})
	}
}

// An https forge's certificate is verified on the way out: a forge the proxy cannot verify
// is refused, even though the runner does not verify its loopback hop.
func TestProxyVerifiesTheForge(t *testing.T) {
	b := newBed(t, true, "", false)
	code, _ := get(t, b.runnerClient(b.px.ProxyURL()), b.forgeURL.String()+"/owner/repo.git/info/refs", nil)
	assert.Equal(t, http.StatusBadGateway, code)
	assert.Zero(t, b.forge.count(), "no request reached an unverified forge")
}

// Other hosts are tunnelled, not intercepted: the runner verifies them itself.
func TestProxyTunnelsOtherHosts(t *testing.T) {
	b := newBed(t, true, "", true)
	other := &recorder{name: "other"}
	otherSrv := httptest.NewTLSServer(other)
	t.Cleanup(otherSrv.Close)
	pu, _ := url.Parse(b.px.ProxyURL())
	verifying := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: pool(otherSrv)}}}
	code, body := get(t, verifying, otherSrv.URL+"/api/actions/runner.v1.RunnerService/Register", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "other /api/actions/runner.v1.RunnerService/Register", body, "the runner API of another host is not the facade's")
	assert.Zero(t, b.facade.count())

	// Plain HTTP to another host is passed on too.
	plain := &recorder{name: "plain"}
	plainSrv := httptest.NewServer(plain)
	t.Cleanup(plainSrv.Close)
	code, body = get(t, b.runnerClient(b.px.ProxyURL()), plainSrv.URL+"/x", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "plain /x", body)
}

// Only the runner holds the proxy's credentials; a job that finds the port is refused.
func TestProxyRefusesCallersWithoutItsCredentials(t *testing.T) {
	b := newBed(t, false, "", true)
	for name, proxyURL := range map[string]string{
		"no credentials":    b.px.URL(),
		"wrong credentials": "http://dynrunner:guess@" + strings.TrimPrefix(b.px.URL(), "http://"),
	} {
		t.Run(name, func(t *testing.T) {
			code, _ := get(t, b.runnerClient(proxyURL), b.forgeURL.String()+"/api/actions/runner.v1.RunnerService/FetchTask", nil)
			assert.Equal(t, http.StatusProxyAuthRequired, code)
			pu, _ := url.Parse(proxyURL)
			tunnel := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			resp, err := tunnel.Get(b.facadeSrv.URL + "/api/actions/runner.v1.RunnerService/FetchTask")
			if err == nil {
				resp.Body.Close()
			}
			require.Error(t, err, "CONNECT without the credentials")
		})
	}
	assert.Zero(t, b.facade.count())
	assert.Zero(t, b.forge.count())
}

// The forwarder, for a loopback forge: the runner's address is the forwarder itself.
func TestForwarderRoutesByPath(t *testing.T) {
	b := newBed(t, false, "/gitea", true)
	c := &http.Client{}
	code, body := get(t, c, b.px.URL()+"/api/actions/runner.v1.RunnerService/UpdateLog", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "facade /api/actions/runner.v1.RunnerService/UpdateLog", body)
	code, body = get(t, c, b.px.URL()+"/owner/repo.git/info/refs", nil)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, "forge /gitea/owner/repo.git/info/refs", body)
}

func TestPlanRunner(t *testing.T) {
	b := newBed(t, false, "", true)
	base := []string{
		"PATH=/usr/bin", "HOME=/home/runner", "DYNRUNNER_TASK_ID=7", "DYNRUNNER_ENV_DIR=/envs/7-9",
		"GITEA_RUNNER_SHA256=ab", "SPIFFE_ENDPOINT_SOCKET=unix:///s", "LOG_FORMAT=json", "NO_PROXY=.corp", "LANG=C.UTF-8",
	}
	t.Run("https forge", func(t *testing.T) {
		plan := planRunner("https://gitea.example.com", b.px, base, "/w/home")
		assert.Equal(t, "https://gitea.example.com", plan.address)
		assert.False(t, plan.forwarded)
		assert.True(t, plan.insecure)
		assert.Equal(t, []string{"PATH=/usr/bin", "HOME=/home/runner", "DYNRUNNER_ENV_DIR=/envs/7-9", "LANG=C.UTF-8", "HTTPS_PROXY=" + b.px.ProxyURL()}, plan.env)
		assert.Equal(t, map[string]string{"HTTPS_PROXY": "", "NO_PROXY": ".corp"}, plan.jobEnv)
		assert.Empty(t, plan.home)
	})
	t.Run("http forge, no home", func(t *testing.T) {
		plan := planRunner("http://10.0.0.2:3000", b.px, []string{"PATH=/bin", "HTTP_PROXY=http://corp:3128"}, "/w/home")
		assert.Equal(t, "http://10.0.0.2:3000", plan.address)
		assert.False(t, plan.insecure)
		assert.Equal(t, []string{"PATH=/bin", "HOME=/w/home", "HTTP_PROXY=" + b.px.ProxyURL()}, plan.env)
		assert.Equal(t, map[string]string{"HTTP_PROXY": "http://corp:3128"}, plan.jobEnv, "the job keeps the environment's own proxy")
		assert.Equal(t, "/w/home", plan.home)
	})
	for _, forge := range []assignment.ForgeURL{"http://127.0.0.1:3000", "http://localhost:3000", "http://[::1]:3000", ""} {
		t.Run("forwarded "+forge.String(), func(t *testing.T) {
			plan := planRunner(forge, b.px, base, "/w/home")
			assert.True(t, plan.forwarded)
			assert.Equal(t, b.px.URL(), plan.address)
			assert.Empty(t, plan.jobEnv)
			_, ok := lookupEnv(plan.env, "HTTP_PROXY")
			assert.False(t, ok)
		})
	}
}

func TestRunnerConfigMasksForJobs(t *testing.T) {
	conf := runnerConfig("/w", runnerPlan{insecure: true, jobEnv: map[string]string{"HTTPS_PROXY": "", "NO_PROXY": ".corp"}})
	assert.Contains(t, conf, "  insecure: true\n  envs:\n    \"HTTPS_PROXY\": \"\"\n    \"NO_PROXY\": \".corp\"\ncache:\n  enabled: true\n")
	assert.NotContains(t, runnerConfig("/w", runnerPlan{}), "envs:")
}
