package guest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/vmworker"
)

const instance = "0f8fad5b-d9cb-469f-a165-70867728950e"

var (
	facadeID = spiffeid.RequireFromString("spiffe://dynrunner.local/dynrunner/facade")
	forge    = "https://gitea.example.com"
	// runner is the "gitea runner" the endpoint serves; the guest only downloads and pins it.
	runner    = []byte("#!/bin/sh\necho gitea-runner v1.0.8\n")
	runnerSHA = sha256Hex(runner)
)

func sha256Hex(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// testCA is a facade CA and what it signs.
type testCA struct {
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	pem  []byte
}

func newCA(t *testing.T) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "facade CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		URIs: []*url.URL{spiffeid.RequireTrustDomainFromString("dynrunner.local").ID().URL()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return testCA{key: key, cert: cert, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serverCert is an X.509-SVID for id signed by the CA, for a TLS server at 127.0.0.1.
func (ca testCA) serverCert(t *testing.T, id spiffeid.ID) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		URIs: []*url.URL{id.URL()}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// endpointRig runs vmworker's real nonce endpoint over an in-process JetStream.
type endpointRig struct {
	log    *eventlog.Log
	nonces *vmworker.Nonces
	srv    *httptest.Server
	ca     testCA
}

func newEndpointRig(t *testing.T) endpointRig {
	t.Helper()
	return newEndpointRigWith(t, executor.GitHubConfig{})
}

// newEndpointRigWith is newEndpointRig whose endpoint grants GitHub slots the runner gh pins.
func newEndpointRigWith(t *testing.T, gh executor.GitHubConfig) endpointRig {
	t.Helper()
	_, js := eventlogtest.Connect(t)
	elCfg := eventlog.DefaultConfig()
	elCfg.Key = eventlogtest.Key
	l, err := eventlog.Open(t.Context(), js, elCfg)
	require.NoError(t, err)
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	n := vmworker.NewNonces(l.Nonces(), box)
	bin := filepath.Join(t.TempDir(), "gitea-runner")
	require.NoError(t, os.WriteFile(bin, runner, 0o755))
	ca := newCA(t)
	e, err := vmworker.NewEndpoint(vmworker.EndpointConfig{
		// The handler refuses callers outside Allowed: the test's loopback stands in for the bridge.
		Listen: "127.0.0.1:7001", Allowed: netip.MustParsePrefix("127.0.0.0/8"),
		FacadeCA: func() ([]byte, error) { return ca.pem, nil },
		Executor: executor.Config{
			FacadeURL: "https://10.213.0.1:8444", FacadeID: facadeID,
			RunnerBin: bin, RunnerSHA256: runnerSHA, RunnerVersion: "v1.0.8", Labels: []string{"self-hosted", "vm"}, Renew: 30 * time.Second,
		},
		GitHub: gh,
		Log:    zerolog.New(zerolog.NewTestWriter(t)),
	}, n, l)
	require.NoError(t, err)
	srv := httptest.NewServer(e.Handler())
	t.Cleanup(srv.Close)
	return endpointRig{log: l, nonces: n, srv: srv, ca: ca}
}

// issue claims task for the VM tier and issues a nonce for it, as the VM worker does before
// it boots a guest; it returns the guest's seed and the claim.
func (r endpointRig) issue(t *testing.T, task assignment.TaskID) (Seed, assignment.State) {
	t.Helper()
	fu, err := assignment.ParseForgeURL(forge)
	require.NoError(t, err)
	st, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: task, At: time.Now(), Actor: "test",
		Backend: assignment.BackendVM, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute, ForgeURL: fu}, nil)
	require.NoError(t, err)
	nonce, err := vmworker.NewNonce()
	require.NoError(t, err)
	require.NoError(t, r.nonces.Issue(t.Context(), nonce, instance, task, st.Epoch(), vmworker.Credential{Token: "drc1.token-" + task.String()}))
	return Seed{InstanceID: instance, Nonce: nonce, Endpoint: r.srv.URL + "/"}, st
}

// prepareGiteaJob is prepare for a Gitea assignment's grant.
func prepareGiteaJob(ctx context.Context, hc *http.Client, cfg Config) (executor.RunConfig, error) {
	j, err := prepare(ctx, hc, cfg)
	if err != nil {
		return executor.RunConfig{}, err
	}
	if j.gitea == nil {
		return executor.RunConfig{}, errors.New("a GitHub slot's job, not a Gitea assignment's")
	}
	return *j.gitea, nil
}

func testConfig(t *testing.T, seed *Seed) Config {
	return Config{Seed: seed, WorkDir: filepath.Join(t.TempDir(), "work"), Log: zerolog.New(zerolog.NewTestWriter(t))}
}

// The guest redeems its nonce at the real endpoint once and prepares exactly what the grant
// says: the token, the assignment, the pinned runner written into its work directory, and TLS
// that accepts only the facade's SPIFFE ID under the granted CA.
func TestPrepareRedeemsAtTheEndpoint(t *testing.T) {
	r := newEndpointRig(t)
	seed, st := r.issue(t, 7)
	cfg := testConfig(t, &seed)

	rc, err := prepareGiteaJob(t.Context(), r.srv.Client(), cfg)
	require.NoError(t, err)
	assert.Equal(t, "drc1.token-7", rc.Token)
	assert.Equal(t, assignment.TaskID(7), rc.Task)
	assert.Equal(t, st.Epoch(), rc.Epoch)
	assert.Equal(t, forge, rc.ForgeURL.String())
	assert.Equal(t, "https://10.213.0.1:8444", rc.FacadeURL)
	assert.Equal(t, facadeID, rc.FacadeID)
	assert.Equal(t, []string{"self-hosted", "vm"}, rc.Labels)
	assert.Equal(t, 30*time.Second, rc.Renew)
	assert.Equal(t, runnerSHA, rc.RunnerSHA256)
	assert.Equal(t, "v1.0.8", rc.RunnerVersion)
	assert.Nil(t, rc.Credential, "no user asked for: the runner runs as the guest")
	assert.Nil(t, rc.Env)

	// The runner is the served one, executable, under the work directory; the job works beside it.
	assert.Equal(t, filepath.Join(cfg.WorkDir, "gitea-runner"), rc.RunnerBin)
	assert.Equal(t, filepath.Join(cfg.WorkDir, "job"), rc.WorkDir)
	got, err := os.ReadFile(rc.RunnerBin)
	require.NoError(t, err)
	assert.Equal(t, runner, got)
	fi, err := os.Stat(rc.RunnerBin)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), fi.Mode().Perm())
	assert.NoFileExists(t, rc.RunnerBin+".part")
	require.NoError(t, executor.VerifyRunner(t.Context(), rc.RunnerBin, rc.RunnerSHA256, ""))

	// TLS to the facade: the granted CA and the facade's SPIFFE ID, nothing else.
	require.NotNil(t, rc.TLS)
	assert.NoError(t, handshake(t, rc.TLS, r.ca.serverCert(t, facadeID)), "the facade's SVID")
	other := spiffeid.RequireFromString("spiffe://dynrunner.local/dynrunner/task/7/epoch/1")
	assert.Error(t, handshake(t, rc.TLS, r.ca.serverCert(t, other)), "another SPIFFE ID under the same CA")
	assert.Error(t, handshake(t, rc.TLS, newCA(t).serverCert(t, facadeID)), "the facade's ID under another CA")

	// The nonce redeems once: a second guest run with the same seed is refused, at once.
	start := time.Now()
	_, err = prepareGiteaJob(t.Context(), r.srv.Client(), testConfig(t, &seed))
	require.ErrorContains(t, err, "redeem refused (410 Gone)")
	assert.ErrorContains(t, err, "already redeemed")
	assert.Less(t, time.Since(start), 900*time.Millisecond, "a refused nonce is not retried")
}

// handshake dials a TLS server presenting cert with the client configuration.
func handshake(t *testing.T, client *tls.Config, cert tls.Certificate) error {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_ = c.(*tls.Conn).Handshake()
		c.Close()
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), client)
	if err == nil {
		c.Close()
	}
	return err
}

// A seed read from the NoCloud directory redeems like one handed in.
func TestPrepareReadsTheSeedDir(t *testing.T) {
	r := newEndpointRig(t)
	seed, _ := r.issue(t, 8)
	dir := t.TempDir()
	meta := "instance-id: " + seed.InstanceID + "\ndynrunner-nonce: " + seed.Nonce + "\ndynrunner-endpoint: " + seed.Endpoint + "\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, "meta-data"), []byte(meta), 0o600))
	cfg := testConfig(t, nil)
	cfg.SeedDir = dir
	rc, err := prepareGiteaJob(t.Context(), r.srv.Client(), cfg)
	require.NoError(t, err)
	assert.Equal(t, "drc1.token-8", rc.Token)

	cfg.SeedDir = t.TempDir() // no meta-data
	_, err = prepareGiteaJob(t.Context(), r.srv.Client(), cfg)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// The endpoint's refusals are final and leave nothing in the work directory.
func TestPrepareRefusedByTheEndpoint(t *testing.T) {
	r := newEndpointRig(t)
	seed, _ := r.issue(t, 9)
	unknown, err := vmworker.NewNonce()
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		seed Seed
		want string
	}{
		{"unknown nonce", Seed{InstanceID: instance, Nonce: unknown, Endpoint: seed.Endpoint}, "404 Not Found"},
		{"another instance's nonce", Seed{InstanceID: "11111111-2222-4333-8444-555555555555", Nonce: seed.Nonce, Endpoint: seed.Endpoint}, "404 Not Found"},
		{"malformed instance id", Seed{InstanceID: strings.ToUpper(instance), Nonce: seed.Nonce, Endpoint: seed.Endpoint}, "400 Bad Request"},
		{"malformed nonce", Seed{InstanceID: instance, Nonce: "a b", Endpoint: seed.Endpoint}, "400 Bad Request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, &tc.seed)
			_, err := prepareGiteaJob(t.Context(), r.srv.Client(), cfg)
			require.ErrorContains(t, err, "guest: redeem refused ("+tc.want+")")
			assert.NoDirExists(t, cfg.WorkDir)
		})
	}
	// None of the refusals spent the nonce.
	rc, err := prepareGiteaJob(t.Context(), r.srv.Client(), testConfig(t, &seed))
	require.NoError(t, err)
	assert.Equal(t, "drc1.token-9", rc.Token)
}

// fakeEndpoint speaks the nonce endpoint's protocol with a grant the test shapes, for answers
// the real endpoint never gives; it counts the redemptions it was asked for.
type fakeEndpoint struct {
	srv     *httptest.Server
	redeems atomic.Int32
	caPEM   []byte
}

func newFakeEndpoint(t *testing.T, redeem http.HandlerFunc, served []byte) *fakeEndpoint {
	t.Helper()
	f := &fakeEndpoint{caPEM: newCA(t).pem}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+executor.RedeemPath, func(w http.ResponseWriter, r *http.Request) {
		f.redeems.Add(1)
		var req executor.RedeemRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.InstanceID != instance || req.Nonce != "nonce-nonce-nonce-nonce" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		redeem(w, r)
	})
	mux.HandleFunc("GET "+executor.RunnerPath, func(w http.ResponseWriter, _ *http.Request) {
		if served == nil {
			http.Error(w, "runner binary unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(served)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEndpoint) seed() *Seed {
	return &Seed{InstanceID: instance, Nonce: "nonce-nonce-nonce-nonce", Endpoint: f.srv.URL}
}

func (f *fakeEndpoint) grant() executor.Grant {
	return executor.NewGrant(executor.Config{
		FacadeURL: "https://10.213.0.1:8444", FacadeID: facadeID, Task: 3, Epoch: 1,
		RunnerSHA256: runnerSHA, Labels: []string{"self-hosted", "vm"}, Renew: 30 * time.Second,
	}, "drc1.tok", f.caPEM)
}

func grantHandler(f **fakeEndpoint, change func(*executor.Grant)) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		g := (*f).grant()
		change(&g)
		_ = json.NewEncoder(w).Encode(g)
	}
}

// A grant the guest cannot trust or use, or a runner that is not the pinned one, stops the
// guest before anything runs; a runner that fails its checksum is not left on disk.
func TestPrepareRefusesTheGrant(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*executor.Grant)
		served []byte
		want   string
		is     error
	}{
		{name: "task id zero", change: func(g *executor.Grant) { g.TaskID = 0 }, served: runner, is: assignment.ErrInvalidID},
		{name: "negative task id", change: func(g *executor.Grant) { g.TaskID = -3 }, served: runner, is: assignment.ErrInvalidID},
		{name: "epoch zero", change: func(g *executor.Grant) { g.Epoch = 0 }, served: runner, is: assignment.ErrInvalidID},
		{name: "facade id not a SPIFFE ID", change: func(g *executor.Grant) { g.FacadeSpiffeID = "https://facade" }, served: runner, want: "guest: facade SPIFFE ID"},
		{name: "forge URL with credentials", change: func(g *executor.Grant) { g.ForgeURL = "https://u:p@gitea.example.com" }, served: runner, is: assignment.ErrInvalidID},
		{name: "CA not PEM", change: func(g *executor.Grant) { g.FacadeCAPEM = "CA" }, served: runner, want: "guest: facade CA"},
		{name: "runner with another checksum", change: func(*executor.Grant) {}, served: []byte("#!/bin/sh\nevil\n"), want: "guest: runner download has SHA-256 " + sha256Hex([]byte("#!/bin/sh\nevil\n")) + ", the grant pins " + runnerSHA},
		{name: "runner pinned to another checksum", change: func(g *executor.Grant) { g.RunnerSHA256 = strings.Repeat("0", 64) }, served: runner, want: "the grant pins " + strings.Repeat("0", 64)},
		{name: "runner unavailable", change: func(*executor.Grant) {}, served: nil, want: "guest: runner download: 503 Service Unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f *fakeEndpoint
			f = newFakeEndpoint(t, grantHandler(&f, tc.change), tc.served)
			cfg := testConfig(t, f.seed())
			_, err := prepareGiteaJob(t.Context(), f.srv.Client(), cfg)
			require.Error(t, err)
			if tc.is != nil {
				require.ErrorIs(t, err, tc.is)
			} else {
				require.ErrorContains(t, err, tc.want)
			}
			assert.NoFileExists(t, filepath.Join(cfg.WorkDir, "gitea-runner"))
			assert.NoFileExists(t, filepath.Join(cfg.WorkDir, "gitea-runner.part"))
			assert.Equal(t, int32(1), f.redeems.Load())
		})
	}
	t.Run("checksum in upper case", func(t *testing.T) {
		var f *fakeEndpoint
		f = newFakeEndpoint(t, grantHandler(&f, func(g *executor.Grant) { g.RunnerSHA256 = strings.ToUpper(runnerSHA) }), runner)
		_, err := prepareGiteaJob(t.Context(), f.srv.Client(), testConfig(t, f.seed()))
		require.NoError(t, err)
	})
}

// A refusal (4xx) or an answer that is no grant is final; a server error is retried, once a
// second, until the endpoint answers or the context ends.
func TestRedeem(t *testing.T) {
	refusals := []struct {
		name string
		h    http.HandlerFunc
		want string
	}{
		{"403", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "only guests", http.StatusForbidden) }, "guest: redeem refused (403 Forbidden): only guests"},
		{"410", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "gone", http.StatusGone) }, "guest: redeem refused (410 Gone): gone"},
		{"not JSON", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("<html>")) }, "guest: redeem answer"},
		{"wrong JSON type", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"task_id": "7"}`)) }, "guest: redeem answer"},
	}
	for _, tc := range refusals {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeEndpoint(t, tc.h, runner)
			_, err := redeem(t.Context(), f.srv.Client(), *f.seed())
			require.ErrorContains(t, err, tc.want)
			assert.Equal(t, int32(1), f.redeems.Load(), "not retried")
		})
	}
	t.Run("server error, then the grant", func(t *testing.T) {
		var f *fakeEndpoint
		ok := grantHandler(&f, func(*executor.Grant) {})
		f = newFakeEndpoint(t, func(w http.ResponseWriter, r *http.Request) {
			if f.redeems.Load() == 1 {
				http.Error(w, "try again", http.StatusServiceUnavailable)
				return
			}
			ok(w, r)
		}, runner)
		g, err := redeem(t.Context(), f.srv.Client(), *f.seed())
		require.NoError(t, err)
		assert.Equal(t, f.grant(), g)
		assert.Equal(t, int32(2), f.redeems.Load())
	})
	t.Run("server errors until the context ends", func(t *testing.T) {
		f := newFakeEndpoint(t, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "try again", http.StatusBadGateway) }, runner)
		ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
		defer cancel()
		_, err := redeem(ctx, f.srv.Client(), *f.seed())
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, int32(2), f.redeems.Load())
	})
}

func TestRedeemAnswer(t *testing.T) {
	g := executor.Grant{TaskID: 7, Epoch: 2, Token: "drc1.tok", Labels: []string{"vm"}}
	body, err := json.Marshal(g)
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		code  int
		body  string
		want  executor.Grant
		retry bool
		err   string
	}{
		{name: "grant", code: 200, body: string(body), want: g},
		{name: "refused", code: 404, body: "unknown nonce\n", err: "guest: redeem refused (404 x): unknown nonce"},
		{name: "redirect is no grant", code: 302, err: "guest: redeem refused (302 x)"},
		{name: "server error", code: 503, retry: true, err: "503 x"},
		{name: "500", code: 500, retry: true, err: "500 x"},
		{name: "not JSON", code: 200, body: "pong\n", err: "guest: redeem answer"},
		{name: "trailing garbage", code: 200, body: string(body) + "}", err: "guest: redeem answer"},
		{name: "wrong type", code: 200, body: `{"labels": "vm"}`, err: "guest: redeem answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, retry, err := redeemAnswer(tc.code, strconv.Itoa(tc.code)+" x", []byte(tc.body))
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.retry, retry)
			if tc.err == "" {
				require.NoError(t, err)
			} else {
				require.Error(t, err)
				assert.True(t, strings.HasPrefix(err.Error(), tc.err), "error %q, want it to start %q", err, tc.err)
			}
		})
	}
}

func TestReadSeed(t *testing.T) {
	for _, tc := range []struct {
		name, meta string
		want       Seed
		ok         bool
	}{
		{"complete", "instance-id: " + instance + "\ndynrunner-nonce: n\ndynrunner-endpoint: http://10.213.0.1:7001\nlocal-hostname: g\n",
			Seed{InstanceID: instance, Nonce: "n", Endpoint: "http://10.213.0.1:7001"}, true},
		{"no nonce", "instance-id: i\ndynrunner-endpoint: http://10.213.0.1:7001\n", Seed{}, false},
		{"no instance id", "dynrunner-nonce: n\ndynrunner-endpoint: http://10.213.0.1:7001\n", Seed{}, false},
		{"no endpoint", "instance-id: i\ndynrunner-nonce: n\n", Seed{}, false},
		{"https endpoint", "instance-id: i\ndynrunner-nonce: n\ndynrunner-endpoint: https://10.213.0.1:7001\n", Seed{}, false},
		{"endpoint without host", "instance-id: i\ndynrunner-nonce: n\ndynrunner-endpoint: http:///x\n", Seed{}, false},
		{"not YAML", "instance-id: [\n", Seed{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "meta-data"), []byte(tc.meta), 0o600))
			got, err := ReadSeed(dir)
			assert.Equal(t, tc.want, got)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, "guest: seed")
			}
		})
	}
	_, err := ReadSeed(t.TempDir())
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestSeedFromEnv(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		name   string
		env    map[string]string
		want   Seed
		found  bool
		wantOK bool
	}{
		{"none", nil, Seed{}, false, true},
		{"instance and endpoint without a nonce", map[string]string{EnvInstanceID: instance, EnvEndpoint: "http://h:1"}, Seed{}, false, true},
		{"complete", map[string]string{EnvInstanceID: instance, EnvNonce: "n", EnvEndpoint: "http://h:1"},
			Seed{InstanceID: instance, Nonce: "n", Endpoint: "http://h:1"}, true, true},
		{"nonce without instance", map[string]string{EnvNonce: "n", EnvEndpoint: "http://h:1"}, Seed{}, true, false},
		{"nonce without endpoint", map[string]string{EnvInstanceID: instance, EnvNonce: "n"}, Seed{}, true, false},
		{"https endpoint", map[string]string{EnvInstanceID: instance, EnvNonce: "n", EnvEndpoint: "https://h:1"}, Seed{}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, found, err := SeedFromEnv(env(tc.env))
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.found, found)
			if tc.wantOK {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, EnvNonce+" is set but")
			}
		})
	}
}

func TestRunAs(t *testing.T) {
	cred, env, err := runAs("")
	require.NoError(t, err)
	assert.Nil(t, cred)
	assert.Nil(t, env)

	me, err := user.Current()
	require.NoError(t, err)
	cred, env, err = runAs(me.Username)
	require.NoError(t, err)
	require.NotNil(t, cred)
	assert.Equal(t, uint32(os.Getuid()), cred.Uid)
	assert.Equal(t, uint32(os.Getgid()), cred.Gid)
	assert.Empty(t, cred.Groups, "the runner gets no supplementary groups of the guest")
	assert.Contains(t, env, "HOME="+me.HomeDir)
	assert.Contains(t, env, "USER="+me.Username)
	assert.Contains(t, env, "LOGNAME="+me.Username)

	_, _, err = runAs("no-such-user-dynrunner")
	var unknown user.UnknownUserError
	require.ErrorAs(t, err, &unknown)

	// A runner's user the guest cannot look up stops it before the runner is downloaded.
	var f *fakeEndpoint
	f = newFakeEndpoint(t, grantHandler(&f, func(*executor.Grant) {}), runner)
	cfg := testConfig(t, f.seed())
	cfg.User = "no-such-user-dynrunner"
	_, err = prepareGiteaJob(t.Context(), f.srv.Client(), cfg)
	require.ErrorAs(t, err, &unknown)
	assert.NoFileExists(t, filepath.Join(cfg.WorkDir, "gitea-runner"))
}

// jit is the JIT configuration of the GitHub slot the tests issue a nonce for.
const jit = "eyJydW5uZXIiOiJqaXQtY29uZmlndXJhdGlvbiJ9"

// issueSlot claims a GitHub slot for the VM tier and issues a nonce for its JIT configuration,
// as the VM worker does for a GitHub job; it returns the guest's seed and the claim.
func (r endpointRig) issueSlot(t *testing.T, task assignment.TaskID) (Seed, assignment.State) {
	t.Helper()
	st, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: task, At: time.Now(), Actor: "test",
		Backend: assignment.BackendVM, Forge: assignment.ForgeGitHub, ScaleSet: 2, RunnerName: "dynrunner-vm-5",
		Lease: time.Hour, Pickup: 10 * time.Minute}, nil)
	require.NoError(t, err)
	nonce, err := vmworker.NewNonce()
	require.NoError(t, err)
	require.NoError(t, r.nonces.Issue(t.Context(), nonce, instance, task, st.Epoch(), vmworker.Credential{JITConfig: jit}))
	return Seed{InstanceID: instance, Nonce: nonce, Endpoint: r.srv.URL + "/"}, st
}

// githubRunner writes a stand-in for GitHub's run.sh, which reports what the runner is given,
// and returns its path and SHA-256.
func githubRunner(t *testing.T) (string, string) {
	t.Helper()
	script := []byte("#!/bin/sh\necho \"jit=$ACTIONS_RUNNER_INPUT_JITCONFIG\"\necho \"pwd=$(pwd)\"\nls \"$(dirname \"$(pwd)\")/secrets\"\necho done\n")
	bin := filepath.Join(t.TempDir(), "run.sh")
	require.NoError(t, os.WriteFile(bin, script, 0o755))
	return bin, sha256Hex(script)
}

// TestRunGitHubSlot: a GitHub slot's guest redeems its nonce for a GitHub grant and runs the
// pinned runner of its image, not a downloaded one, with the JIT configuration, which it takes
// out of its secrets directory before the runner starts; nothing of the facade is involved.
func TestRunGitHubSlot(t *testing.T) {
	bin, sha := githubRunner(t)
	r := newEndpointRigWith(t, executor.GitHubConfig{RunnerBin: bin, RunnerSHA256: sha})
	seed, st := r.issueSlot(t, assignment.SlotBase+5)
	cfg := testConfig(t, &seed)
	j, err := prepare(t.Context(), r.srv.Client(), cfg)
	require.NoError(t, err)
	require.Nil(t, j.gitea)
	require.NotNil(t, j.github)
	assert.Equal(t, st.Task, j.github.Task)
	assert.Equal(t, st.Epoch(), j.github.Epoch)
	assert.Equal(t, bin, j.github.RunnerBin)
	assert.Equal(t, sha, j.github.RunnerSHA256)
	assert.Equal(t, filepath.Join(cfg.WorkDir, "job"), j.github.WorkDir)
	secret := filepath.Join(j.github.SecretsDir, executor.JITConfigFile)
	got, err := os.ReadFile(secret)
	require.NoError(t, err)
	assert.Equal(t, jit, string(got))
	fi, err := os.Stat(secret)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the JIT configuration is readable by others")
	assert.NoFileExists(t, filepath.Join(cfg.WorkDir, "gitea-runner"), "a runner was downloaded for a GitHub slot")

	// The whole run, on a new slot's nonce.
	seed, _ = r.issueSlot(t, assignment.SlotBase+6)
	cfg = testConfig(t, &seed)
	var out bytes.Buffer
	cfg.Output = &out
	require.NoError(t, Run(t.Context(), cfg))
	assert.Contains(t, out.String(), "jit="+jit+"\n")
	assert.Contains(t, out.String(), "pwd="+filepath.Join(cfg.WorkDir, "job")+"\n")
	assert.NotContains(t, out.String(), executor.JITConfigFile, "the JIT configuration file was still there when the runner ran")
	assert.Contains(t, out.String(), "done\n")
}

// TestRunGitHubSlotRefused: a GitHub grant the guest cannot use, or an image whose runner is
// not the pinned one, stops the guest before the runner runs.
func TestRunGitHubSlotRefused(t *testing.T) {
	bin, sha := githubRunner(t)
	for _, tc := range []struct {
		name   string
		change func(*executor.Grant)
		want   string
	}{
		{"runner with another checksum", func(g *executor.Grant) { g.GitHub.RunnerSHA256 = strings.Repeat("0", 64) }, "pinned " + strings.Repeat("0", 64)},
		{"relative runner path", func(g *executor.Grant) { g.GitHub.RunnerBin = "run.sh" }, "is not absolute"},
		{"no JIT configuration", func(g *executor.Grant) { g.GitHub.JITConfig = "" }, "without its JIT configuration"},
		{"not a slot", func(g *executor.Grant) { g.TaskID = 7 }, "no GitHub slot's id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeEndpoint(t, func(w http.ResponseWriter, _ *http.Request) {
				g := executor.NewGitHubGrant(executor.GitHubConfig{Task: assignment.SlotBase + 5, Epoch: 3, RunnerBin: bin, RunnerSHA256: sha}, jit)
				tc.change(&g)
				_ = json.NewEncoder(w).Encode(g)
			}, nil)
			cfg := testConfig(t, f.seed())
			var out bytes.Buffer
			cfg.Output = &out
			err := Run(t.Context(), cfg)
			require.ErrorContains(t, err, tc.want)
			assert.NotContains(t, err.Error(), jit)
			assert.NotContains(t, out.String(), "done", "the runner ran")
		})
	}
}
