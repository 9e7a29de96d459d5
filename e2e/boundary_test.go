package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/testbed/netnstest"
)

// seen is one request that reached the forge.
type seen struct {
	method, path string
	// text is the request line and every header, for searching.
	text string
}

// forgeRecorder is a reverse proxy in front of Gitea, serving its ROOT_URL inside the forge's
// host: everything any party sends to the forge passes it and is recorded.
type forgeRecorder struct {
	mu   sync.Mutex
	reqs []seen
}

func newForgeRecorder(t *testing.T, host *netnstest.Host) *forgeRecorder {
	t.Helper()
	rec := &forgeRecorder{}
	gitea := &url.URL{Scheme: "http", Host: "127.0.0.1:3000"}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(gitea); r.Out.Host = r.In.Host },
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return host.Dial(addr, 10*time.Second)
		}},
		// Gitea is not up yet while devforge polls it: the 502s say enough.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s\n", r.Method, r.URL.RequestURI())
		for k, vs := range r.Header {
			fmt.Fprintf(&b, "%s: %s\n", k, strings.Join(vs, ", "))
		}
		rec.mu.Lock()
		rec.reqs = append(rec.reqs, seen{method: r.Method, path: r.URL.Path, text: b.String()})
		rec.mu.Unlock()
		rp.ServeHTTP(w, r)
	})}
	ln := host.Listen(t, 3000)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return rec
}

func (r *forgeRecorder) all() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.reqs...)
}

// TestDockerJobTokenBoundaries plays an attacker inside a docker-backend job. Another job (of a
// private repository) has ended and its token leaked; the attacker tries that token and its
// own against the other repository's git, REST and artifact (v3 and v4) paths, and tries the
// facade — with the environment's own SVID — for the same paths. Every attempt is refused.
// Meanwhile the test searches the attacker's container (files and process environments) for
// the resident runner's credentials, and checks that no request that reached the forge other
// than the controller's runner API calls carried them.
func TestDockerJobTokenBoundaries(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	image := executorImage(t)
	host := netnstest.New(t)
	rec := newForgeRecorder(t, host)
	f, err := devforge.Start(t.Context(), tools, devforge.Options{Dir: t.TempDir(), Netns: host.Name, Addr: host.Addr.String(), Listen: "127.0.0.1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	ctx := t.Context()
	artifact, err := f.CreateRepo(ctx, "artifact")
	require.NoError(t, err)
	_, err = f.PushFiles(ctx, artifact, artifactAction)
	require.NoError(t, err)
	victim, err := f.CreatePrivateRepo(ctx, "victim")
	require.NoError(t, err)
	attacker, err := f.CreateRepo(ctx, "attacker")
	require.NoError(t, err)
	c := newController(t, tools, f, "", leaseEnv, pickupEnv, "POD_BACKEND=docker", "POD_EXECUTOR_IMAGE="+image)
	c.start()

	// The victim's job uploads artifacts and, carelessly, leaves its token in its log.
	sha, err := f.PushWorkflow(ctx, victim, ".gitea/workflows/victim.yml", `name: victim
on: [push]
jobs:
  victim:
    runs-on: [self-hosted, pod]
    steps:
      - run: echo "victim's secret" > secret.txt
      - uses: `+f.URL()+"/"+artifact.String()+`@main
        with: {mode: upload, api: v3, name: victim-v3, path: secret.txt}
      - uses: `+f.URL()+"/"+artifact.String()+`@main
        with: {mode: upload, api: v4, name: victim-v4, path: secret.txt}
      - env:
          TOKEN: ${{ gitea.token }}
        run: echo "leaked $(printf %s "$TOKEN" | base64 -w0)"
`)
	require.NoError(t, err)
	vrun := waitRun(t, f, victim, sha, 5*time.Minute)
	require.Len(t, vrun.Jobs, 1)
	vlog, err := f.JobLog(ctx, victim, vrun.Jobs[0].ID)
	require.NoError(t, err)
	require.Equal(t, "success", vrun.Jobs[0].Conclusion, tail(vlog, 40))
	m := regexp.MustCompile(`leaked ([A-Za-z0-9+/=]+)`).FindStringSubmatch(vlog)
	require.NotNil(t, m, "the victim's job leaked no token:\n%s", tail(vlog, 20))
	stolen, err := base64.StdEncoding.DecodeString(m[1])
	require.NoError(t, err)
	require.NoError(t, f.SetSecret(ctx, attacker, "STOLEN", string(stolen)))

	// The attacker's job, once the victim's has ended.
	vURL := f.URL() + "/" + victim.String()
	sha, err = f.PushWorkflow(ctx, attacker, ".gitea/workflows/attack.yml", fmt.Sprintf(`name: attack
on: [push]
jobs:
  attack:
    runs-on: [self-hosted, pod]
    steps:
      - env:
          STOLEN: ${{ secrets.STOLEN }}
          OWN: ${{ gitea.token }}
        run: |
          fail=
          try() { local what=$1; shift; if out=$("$@" 2>&1); then echo "ALLOWED: $what: $out"; fail=1; else echo "refused: $what"; fi; }
          basic() { printf 'x-access-token:%%s' "$1" | base64 -w0; }
          pipeline="${ACTIONS_RUNTIME_URL}_apis/pipelines/workflows/%[2]d/artifacts?api-version=6.0-preview"
          v4list() { curl -sSf -X POST -H "Authorization: Bearer $1" -H 'Content-Type: application/json' \
            -d "{\"workflowRunBackendId\":\"%[2]d\",\"workflowJobRunBackendId\":\"%[3]d\",\"nameFilter\":\"victim-v4\"}" \
            "$ACTIONS_RESULTS_URL/twirp/github.actions.results.api.v1.ArtifactService/ListArtifacts"; }
          for who in STOLEN OWN; do
            tok=${!who}
            try "git clone with the $who token" git -c http.extraHeader="Authorization: Basic $(basic "$tok")" clone -q %[1]q v-$who
            try "REST API with the $who token" curl -sSf -H "Authorization: token $tok" "${{ github.api_url }}/repos/%[4]s"
            try "v3 artifacts with the $who token" curl -sSf -H "Authorization: Bearer $tok" "$pipeline"
            try "v4 artifacts with the $who token" v4list "$tok"
          done
          # The facade, with this environment's own identity, for the forge's paths.
          facade=$(tr '\0' '\n' </proc/1/environ | sed -n 's/^DYNRUNNER_FACADE_URL=//p')
          s=/run/dynrunner/secrets
          [[ -n $facade && -r $s/svid.pem ]] || { echo "no facade or SVID to try"; exit 1; }
          for path in /%[4]s.git/info/refs?service=git-upload-pack /api/v1/repos/%[4]s "/api/actions_pipeline/_apis/pipelines/workflows/%[2]d/artifacts?api-version=6.0-preview"; do
            try "the facade for $path" curl -sSf -k --cert $s/svid.pem --key $s/svid_key.pem -H "Authorization: Bearer $OWN" "$facade$path"
          done
          [[ -z $fail ]]
      - name: wait for the inspection
        run: echo "ready for the inspection"; for i in $(seq 1 120); do [[ -e /tmp/inspected ]] && break; sleep 0.5; done; echo "inspected"
`, vURL, vrun.ID, vrun.Jobs[0].ID, victim.String()))
	require.NoError(t, err)

	// While the attacker's job runs: the resident runner's credentials are nowhere in its
	// container.
	var creds struct{ UUID, Token string }
	state := filepath.Join(strings.TrimPrefix(envOf(c, "STATE_DIR"), "STATE_DIR="), "gitea-runner.json")
	b, err := os.ReadFile(state)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &creds))
	require.NotEmpty(t, creds.Token)
	var id string
	deadline := time.Now().Add(3 * time.Minute)
	for id == "" {
		out, _ := exec.CommandContext(ctx, "docker", "ps", "-q", "--filter", "label=dynrunner.managed=true", "--filter", "label=dynrunner.scope=default").Output()
		if ids := strings.Fields(string(out)); len(ids) == 1 {
			id = ids[0]
		}
		require.False(t, time.Now().After(deadline), "no attacker container within 3 minutes")
		time.Sleep(200 * time.Millisecond)
	}
	waitLogged(t, f, attacker, sha, " ready for the inspection\n", 3*time.Minute)
	for _, secret := range []string{creds.Token, creds.UUID} {
		out, err := exec.CommandContext(ctx, "docker", "exec", id, "sh", "-c",
			`grep -rlsF "$1" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev; for e in /proc/[0-9]*/environ; do grep -lsF "$1" "$e"; done; true`, "sh", secret).CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Empty(t, strings.TrimSpace(string(out)), "the resident runner's credentials are readable in the job's container")
	}
	require.NoError(t, exec.CommandContext(ctx, "docker", "exec", id, "touch", "/tmp/inspected").Run())

	run := waitRun(t, f, attacker, sha, 5*time.Minute)
	require.Len(t, run.Jobs, 1)
	alog, err := f.JobLog(ctx, attacker, run.Jobs[0].ID)
	require.NoError(t, err)
	assert.Equal(t, "success", run.Jobs[0].Conclusion, "every attempt refused:\n%s", tail(devforge.NormalizeLog(alog), 60))
	nlog := devforge.NormalizeLog(alog)
	assert.NotRegexp(t, `(?m)^ALLOWED: `, nlog)
	assert.Len(t, regexp.MustCompile(`(?m)^refused: `).FindAllString(nlog, -1), 11, "eight forge attempts and three facade attempts:\n%s", tail(nlog, 40))

	// What reached the forge: the controller's runner API calls carry the resident runner's
	// credentials; nothing else does, and the jobs' own requests did pass here.
	var runnerAPI, jobs int
	for _, r := range rec.all() {
		carries := strings.Contains(r.text, creds.Token) || strings.Contains(r.text, creds.UUID)
		isAPI := strings.HasPrefix(r.path, "/api/actions/runner.v1.RunnerService/") || strings.HasPrefix(r.path, "/api/actions/ping.v1.PingService/")
		if carries {
			assert.True(t, isAPI, "a request other than the runner API carries the resident runner's credentials: %s", r.text)
			runnerAPI++
		}
		if strings.Contains(r.path, ".git/") || strings.HasPrefix(r.path, "/api/actions_pipeline/") || strings.HasPrefix(r.path, "/twirp/") {
			jobs++
		}
	}
	assert.Positive(t, runnerAPI, "the recorder saw the controller's runner API calls")
	assert.Positive(t, jobs, "the recorder saw the jobs' git and artifact requests")
	assertNoContainers(t)
}

// envOf returns the controller's KEY=value setting for key, or "".
func envOf(c *controller, key string) string {
	for _, kv := range c.env {
		if strings.HasPrefix(kv, key+"=") {
			return kv
		}
	}
	return ""
}

// TestReadyzSeesADeletedStream: someone with the NATS password deletes the assignments stream
// under a running controller; /readyz turns red and names it, instead of staying green while
// every job fails.
func TestReadyzSeesADeletedStream(t *testing.T) {
	tools := needTools(t)
	f := startForge(t, tools)
	c := newController(t, tools, f, "", leaseEnv, pickupEnv)
	c.start()
	state := strings.TrimPrefix(envOf(c, "STATE_DIR"), "STATE_DIR=")
	pw, err := os.ReadFile(filepath.Join(state, "nats.password"))
	require.NoError(t, err)
	nc, err := nats.Connect("nats://"+strings.TrimPrefix(envOf(c, "NATS_EMBEDDED_LISTEN"), "NATS_EMBEDDED_LISTEN="),
		nats.UserInfo("dynrunner", strings.TrimSpace(string(pw))))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	require.NoError(t, js.DeleteStream(t.Context(), eventlog.StreamAssignments))

	resp, err := http.Get(c.httpURL + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, string(body), eventlog.StreamAssignments+" is missing")
}
