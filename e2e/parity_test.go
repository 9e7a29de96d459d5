package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/testbed/netnstest"
)

// greetAction is a JavaScript action as most published ones are, without dependencies: it
// reads an input (a default from action.yml included) and writes an output. It prints nothing
// that differs between environments, so its log lines compare across runners.
var greetAction = map[string]string{
	"action.yml": `name: greet
description: greets an input
inputs:
  who:
    description: whom to greet
    required: true
  punctuation:
    description: what ends the greeting
    default: "!"
outputs:
  greeting:
    description: the greeting
runs:
  using: node20
  main: index.js
`,
	"index.js": `const fs = require("fs");
const os = require("os");
const who = process.env.INPUT_WHO;
if (!who) {
  console.error("INPUT_WHO is not set");
  process.exit(1);
}
console.log("input who=" + who);
fs.appendFileSync(process.env.GITHUB_OUTPUT, "greeting=hello " + who + process.env.INPUT_PUNCTUATION + os.EOL);
`,
}

// artifactAction uploads or downloads one file as an artifact through the forge's artifact
// APIs, as actions/upload-artifact and actions/download-artifact do: v3 (the pipeline API
// below ACTIONS_RUNTIME_URL) or v4 (the results API at ACTIONS_RESULTS_URL), authenticated
// with the job's ACTIONS_RUNTIME_TOKEN only.
var artifactAction = map[string]string{
	"action.yml": `name: artifact
description: uploads or downloads one file as an artifact (v3 or v4 API)
inputs:
  mode:
    description: upload or download
    required: true
  api:
    description: v3 or v4
    required: true
  name:
    description: the artifact's name
    required: true
  path:
    description: the file to upload, or where to write the download
    required: true
runs:
  using: node20
  main: index.js
`,
	"index.js": `const fs = require("fs");
const path = require("path");
const crypto = require("crypto");
const env = process.env;
const mode = env.INPUT_MODE, api = env.INPUT_API, name = env.INPUT_NAME, file = env.INPUT_PATH;
const token = env.ACTIONS_RUNTIME_TOKEN;

async function call(method, url, body, headers) {
  const res = await fetch(url, { method, body, headers: Object.assign({ Authorization: "Bearer " + token }, headers || {}) });
  const text = await res.text();
  if (!res.ok) throw new Error(method + " " + new URL(url).pathname + " answered " + res.status + ": " + text);
  return text;
}
const json = (s) => JSON.parse(s);

async function v3() {
  const base = env.ACTIONS_RUNTIME_URL + "_apis/pipelines/workflows/" + env.GITHUB_RUN_ID + "/artifacts?api-version=6.0-preview";
  if (mode === "upload") {
    const data = fs.readFileSync(file);
    const up = new URL(json(await call("POST", base, JSON.stringify({ Type: "actions_storage", Name: name }), { "Content-Type": "application/json" })).fileContainerResourceUrl);
    up.searchParams.set("itemPath", name + "/" + path.basename(file));
    await call("PUT", up.toString(), data, {
      "Content-Type": "application/octet-stream",
      "Content-Range": "bytes 0-" + (data.length - 1) + "/" + data.length,
      "x-tfs-filelength": String(data.length),
      "x-actions-results-md5": crypto.createHash("md5").update(data).digest("base64"),
    });
    await call("PATCH", base + "&artifactName=" + encodeURIComponent(name), JSON.stringify({ Size: data.length }), { "Content-Type": "application/json" });
    return;
  }
  const found = json(await call("GET", base)).value.find((a) => a.name === name);
  if (!found) throw new Error("no artifact " + name + " in this run");
  const list = new URL(found.fileContainerResourceUrl);
  list.searchParams.set("itemPath", name);
  const item = json(await call("GET", list.toString())).value[0];
  fs.writeFileSync(file, Buffer.from(await (await fetch(item.contentLocation, { headers: { Authorization: "Bearer " + token } })).arrayBuffer()));
}

async function v4() {
  const claims = json(Buffer.from(token.split(".")[1], "base64url").toString());
  const scope = claims.scp.split(" ").find((s) => s.startsWith("Actions.Results:")).split(":");
  const ids = { workflowRunBackendId: scope[1], workflowJobRunBackendId: scope[2] };
  const svc = env.ACTIONS_RESULTS_URL + "/twirp/github.actions.results.api.v1.ArtifactService/";
  const twirp = async (method, req) => json(await call("POST", svc + method, JSON.stringify(Object.assign({}, ids, req)), { "Content-Type": "application/json" }));
  if (mode === "upload") {
    const data = fs.readFileSync(file);
    const created = await twirp("CreateArtifact", { name, version: 4 });
    const res = await fetch(created.signedUploadUrl + "&comp=block", { method: "PUT", body: data });
    if (!res.ok) throw new Error("upload answered " + res.status + ": " + (await res.text()));
    await twirp("FinalizeArtifact", { name, size: String(data.length), hash: "sha256:" + crypto.createHash("sha256").update(data).digest("hex") });
    return;
  }
  const listed = await twirp("ListArtifacts", { nameFilter: name });
  if (!listed.artifacts || listed.artifacts.length !== 1) throw new Error("ListArtifacts: " + JSON.stringify(listed));
  const signed = await twirp("GetSignedArtifactURL", { name });
  const res = await fetch(signed.signedUrl);
  if (!res.ok) throw new Error("download answered " + res.status);
  fs.writeFileSync(file, Buffer.from(await res.arrayBuffer()));
}

(api === "v4" ? v4() : v3()).then(
  () => console.log(mode + "ed " + name + " (" + api + ")"),
  (err) => { console.error(err.message); process.exit(1); },
);
`,
}

// parityWorkflow is the workflow nearly every repository has, on tier: a JavaScript action
// with an input and an output, a clone of the repository from the forge and a push with the
// job's token, the runner's cache, artifacts passed between jobs through both artifact APIs,
// bash. It checks that the job sees the forge's own URL (root, Gitea's ROOT_URL without its
// slash) and no trace of dynrunner. Nothing it prints depends on the repository's name, so
// the logs of two repositories compare.
func parityWorkflow(tier, root string, greet, artifact devforge.Repo) string {
	r := strings.NewReplacer("@TIER@", tier, "@ROOT@", root, "@GREET@", root+"/"+greet.String(), "@ARTIFACT@", root+"/"+artifact.String())
	return r.Replace(`name: parity
on: [push]
jobs:
  produce:
    runs-on: [self-hosted, @TIER@]
    outputs:
      greeting: ${{ steps.greet.outputs.greeting }}
    steps:
      - id: greet
        uses: @GREET@@main
        with:
          who: parity
      - name: the forge's own URL
        run: |
          declare -A want=(
            [gitea.server_url]="${{ gitea.server_url }}"
            [github.server_url]="${{ github.server_url }}"
            [GITHUB_SERVER_URL]="$GITHUB_SERVER_URL"
            [ACTIONS_RESULTS_URL]="$ACTIONS_RESULTS_URL"
            [ACTIONS_RUNTIME_URL]="${ACTIONS_RUNTIME_URL%/api/actions_pipeline/}"
            [github.api_url]="${{ github.api_url }}"
          )
          for k in "${!want[@]}"; do
            v=${want[$k]}
            [[ $k == github.api_url ]] && v=${v%/api/v1}
            if [[ $v != "@ROOT@" ]]; then echo "$k is $v, not @ROOT@"; exit 1; fi
          done
          echo "every server URL is the forge's ROOT_URL"
      - name: no trace of dynrunner
        run: |
          if leaked=$(compgen -e | grep -E '^(DYNRUNNER_|GITEA_RUNNER_|SPIFFE_)' | grep -vx DYNRUNNER_ENV_DIR); then
            echo "dynrunner's settings reach the job: $leaked"; exit 1
          fi
          for v in HTTP_PROXY HTTPS_PROXY http_proxy https_proxy; do
            if [[ -n ${!v:-} ]]; then echo "$v is set for the job"; exit 1; fi
          done
          [[ -n $HOME && -d $HOME ]] || { echo "no home"; exit 1; }
          echo "the environment is the job's own"
      - name: clone and push with the job token
        env:
          TOKEN: ${{ gitea.token }}
        run: |
          auth=$(printf 'x-access-token:%s' "$TOKEN" | base64 -w0)
          git -c http.extraHeader="Authorization: Basic $auth" clone -q "${{ gitea.server_url }}/$GITHUB_REPOSITORY" repo
          cd repo
          git log -1 --format='cloned at %s'
          git switch -q -c from-the-job
          git -c user.name=parity -c user.email=parity@example.invalid commit -q --allow-empty -m "pushed from the job"
          if ! out=$(git -c http.extraHeader="Authorization: Basic $auth" push -q origin from-the-job 2>&1); then
            echo "$out"; exit 1
          fi
          echo "pushed from-the-job"
      - name: the REST API with the job token
        env:
          TOKEN: ${{ gitea.token }}
        run: |
          name=$(curl -sSf -H "Authorization: token $TOKEN" "${{ github.api_url }}/repos/$GITHUB_REPOSITORY" | node -pe 'JSON.parse(require("fs").readFileSync(0)).full_name')
          [[ $name == "$GITHUB_REPOSITORY" ]] && echo "the API knows the repository"
      - name: the runner's cache
        run: |
          c="${ACTIONS_CACHE_URL}_apis/artifactcache"
          auth="Authorization: Bearer $ACTIONS_RUNTIME_TOKEN"
          printf 'cached content' > blob
          id=$(curl -sSf -X POST -H "$auth" -H 'Content-Type: application/json' -d '{"key":"parity-key","version":"v1"}' "$c/caches" | node -pe 'JSON.parse(require("fs").readFileSync(0)).cacheId')
          curl -sSf -o /dev/null -X PATCH -H "$auth" -H 'Content-Type: application/octet-stream' -H 'Content-Range: bytes 0-13/*' --data-binary @blob "$c/caches/$id"
          curl -sSf -o /dev/null -X POST -H "$auth" -H 'Content-Type: application/json' -d '{"size":14}' "$c/caches/$id"
          loc=$(curl -sSf -H "$auth" "$c/cache?keys=parity-key&version=v1" | node -pe 'JSON.parse(require("fs").readFileSync(0)).archiveLocation')
          echo "restored: $(curl -sSf "$loc")"
      - run: printf 'artifact v3 from produce\n' > v3.txt; printf 'artifact v4 from produce\n' > v4.txt
      - uses: @ARTIFACT@@main
        with: {mode: upload, api: v3, name: parity-v3, path: v3.txt}
      - uses: @ARTIFACT@@main
        with: {mode: upload, api: v4, name: parity-v4, path: v4.txt}
  consume:
    needs: produce
    runs-on: [self-hosted, @TIER@]
    steps:
      - run: echo "the action said ${{ needs.produce.outputs.greeting }}"
      - uses: @ARTIFACT@@main
        with: {mode: download, api: v3, name: parity-v3, path: got-v3.txt}
      - uses: @ARTIFACT@@main
        with: {mode: download, api: v4, name: parity-v4, path: got-v4.txt}
      - run: |
          shopt -s extglob
          for f in got-v@(3|4).txt; do echo "$f: $(<"$f")"; done
`)
}

// parityBed is a forge on a host of its own (a network namespace: not loopback, as in
// production), its actions, and a static runner as the reference, registered for a
// repository of its own with the labels of every tier.
type parityBed struct {
	forge            *devforge.Forge
	host             *netnstest.Host
	static, dynamic  devforge.Repo
	greet, artifacts devforge.Repo
}

func newParityBed(t *testing.T, tools devforge.Tools) *parityBed {
	t.Helper()
	f, host := startForgeOnHost(t, tools)
	ctx := t.Context()
	b := &parityBed{forge: f, host: host}
	var err error
	for _, r := range []struct {
		repo  *devforge.Repo
		name  string
		files map[string]string
	}{
		{&b.greet, "greet", greetAction}, {&b.artifacts, "artifact", artifactAction},
		{&b.static, "static", nil}, {&b.dynamic, "dynamic", nil},
	} {
		*r.repo, err = f.CreateRepo(ctx, r.name)
		require.NoError(t, err)
		if r.files != nil {
			_, err = f.PushFiles(ctx, *r.repo, r.files)
			require.NoError(t, err)
		}
	}
	reg, err := f.RunnerRegistrationToken(ctx, b.static.String())
	require.NoError(t, err)
	sr, err := devforge.StartStaticRunner(ctx, tools, f.URL(), reg, executor.Labels(assignment.BackendPod, assignment.BackendVM), filepath.Join(t.TempDir(), "static"), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sr.Close() })
	return b
}

// compare runs the parity workflow on tier on the static runner and through dynrunner and
// requires the same jobs, conclusions and normalised logs, all successful, and the branch
// each run pushed.
func (b *parityBed) compare(t *testing.T, tier string, limit time.Duration) {
	t.Helper()
	wf := parityWorkflow(tier, b.forge.URL(), b.greet, b.artifacts)
	began := time.Now()
	want := runWorkflow(t, b.forge, b.static, wf, limit)
	t.Logf("static runner: %d jobs in %s", len(want), time.Since(began).Round(time.Second))
	began = time.Now()
	got := runWorkflow(t, b.forge, b.dynamic, wf, limit)
	t.Logf("dynrunner (%s): %d jobs in %s", tier, len(got), time.Since(began).Round(time.Second))

	require.ElementsMatch(t, []string{"produce", "consume"}, keys(want), "the static runner's jobs")
	require.ElementsMatch(t, keys(want), keys(got), "the jobs dynrunner ran")
	for name, w := range want {
		g := got[name]
		assert.Equal(t, "success", w.conclusion, "static runner, job %s:\n%s", name, tail(w.log, 40))
		assert.Equal(t, w.conclusion, g.conclusion, "job %s: dynrunner %s, static runner %s\n%s", name, g.conclusion, w.conclusion, tail(g.log, 40))
		assert.Equal(t, w.log, g.log, "job %s: the logs differ after normalisation", name)
	}
	for _, line := range []string{
		"input who=parity", "every server URL is the forge's ROOT_URL", "the environment is the job's own",
		"cloned at devforge: update .gitea/workflows/e2e.yml", "pushed from-the-job", "the API knows the repository",
		"restored: cached content", "uploaded parity-v3 (v3)", "uploaded parity-v4 (v4)",
	} {
		assert.Contains(t, got["produce"].log, line, "job produce")
	}
	for _, line := range []string{"the action said hello parity!", "got-v3.txt: artifact v3 from produce", "got-v4.txt: artifact v4 from produce"} {
		assert.Contains(t, got["consume"].log, line, "job consume")
	}
	for _, r := range []devforge.Repo{b.static, b.dynamic} {
		subject, err := b.forge.BranchHead(context.WithoutCancel(t.Context()), r, "from-the-job")
		if assert.NoError(t, err, "the branch the job of %s pushed", r) {
			assert.Equal(t, "pushed from the job", subject)
		}
	}
}

// TestParityLocalBackend: the parity workflow on [self-hosted, pod] with the local backend
// behaves as on a static runner.
func TestParityLocalBackend(t *testing.T) {
	tools := needTools(t)
	b := newParityBed(t, tools)
	c := newController(t, tools, b.forge, b.dynamic.String(), leaseEnv, pickupEnv)
	c.start()
	b.compare(t, "pod", 10*time.Minute)
	assertNoEnvironmentsLeft(t, c)
}

// TestParityDockerBackend: the parity workflow on [self-hosted, pod] with the docker backend
// (a hardened container of the executor image) behaves as on a static runner.
func TestParityDockerBackend(t *testing.T) {
	tools := needTools(t)
	needDocker(t)
	image := executorImage(t)
	b := newParityBed(t, tools)
	c := newController(t, tools, b.forge, b.dynamic.String(), leaseEnv, pickupEnv, "POD_BACKEND=docker", "POD_EXECUTOR_IMAGE="+image)
	c.start()
	b.compare(t, "pod", 10*time.Minute)
	assertNoContainers(t)
}

// TestParityVM: the parity workflow on [self-hosted, vm] in a microVM of the Debian guest
// image under QEMU, with NAT egress to the forge only, behaves as on a static runner. A second
// workflow then checks from inside a guest what it cannot reach: a host that is not on the
// allow list and a port of the controller's host other than the nonce endpoint and the
// facade's guest listener.
func TestParityVM(t *testing.T) {
	tools := needTools(t)
	img := vmImage(t)
	b := newParityBed(t, tools)
	const bridge = "drpar0"
	c := newController(t, tools, b.forge, b.dynamic.String(),
		append([]string{leaseEnv, pickupEnv, "VM_EGRESS=nat"}, vmEnv(t, img, bridge, "10.213.79.1/24")...)...)
	c.start()
	b.compare(t, "vm", 15*time.Minute)

	// What the guest must not reach: a listener on a host of its own, not on the allow list,
	// and one on the controller's host at the bridge address.
	other := netnstest.New(t)
	serveHTTP(t, other.Listen(t, 8080))
	host, err := net.Listen("tcp4", "10.213.79.1:0")
	require.NoError(t, err)
	serveHTTP(t, host)
	res := runWorkflow(t, b.forge, b.dynamic, `name: egress
on: [push]
jobs:
  egress:
    runs-on: [self-hosted, vm]
    steps:
      - run: |
          curl -sSf -o /dev/null "${{ gitea.server_url }}/api/healthz" && echo "the forge answers"
          for target in http://`+other.Addr.String()+`:8080/ http://`+host.Addr().String()+`/; do
            if out=$(curl -sS --max-time 20 "$target" 2>&1); then echo "reached $target: $out"; exit 1; fi
            echo "refused: $target: $out"
          done
`, 10*time.Minute)
	eg := res["egress"]
	assert.Equal(t, "success", eg.conclusion, eg.log)
	assert.Contains(t, eg.log, "the forge answers")
	assert.Regexp(t, `refused: http://`+regexp.QuoteMeta(other.Addr.String())+`:8080/: curl: \(7\) Failed to connect`, eg.log, "a host not on the allow list")
	assert.Regexp(t, `refused: http://`+regexp.QuoteMeta(host.Addr().String())+`/: curl: \(7\) Failed to connect`, eg.log, "the controller's host")
}

// serveHTTP answers every request on ln with "reached", until the test ends.
func serveHTTP(t *testing.T, ln net.Listener) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "reached") }), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
}
