package vmworker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
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

type rig struct {
	log    *eventlog.Log
	nonces *vmworker.Nonces
}

func newRig(t *testing.T) rig {
	t.Helper()
	_, js := eventlogtest.Connect(t)
	elCfg := eventlog.DefaultConfig()
	elCfg.Key = eventlogtest.Key
	l, err := eventlog.Open(t.Context(), js, elCfg)
	require.NoError(t, err)
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	return rig{log: l, nonces: vmworker.NewNonces(l.Nonces(), box)}
}

const instance = "0f8fad5b-d9cb-469f-a165-70867728950e"

func (r rig) claimVM(t *testing.T, task assignment.TaskID) assignment.State {
	t.Helper()
	st, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: task, At: time.Now(), Actor: "test",
		Backend: assignment.BackendVM, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	require.NoError(t, err)
	return st
}

func TestNonceRedeemsOnceUnderRace(t *testing.T) {
	r := newRig(t)
	nonce, err := vmworker.NewNonce()
	require.NoError(t, err)
	require.NoError(t, r.nonces.Issue(t.Context(), nonce, instance, 5, 9, vmworker.Credential{Token: "drc1.secret"}))
	_, _, _, err = r.nonces.Redeem(t.Context(), "11111111-2222-4333-8444-555555555555", nonce)
	require.ErrorIs(t, err, vmworker.ErrUnknownNonce, "redeem by another instance")
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, tokens := 0, []string{}
	for range 8 {
		wg.Go(func() {
			_, _, cred, err := r.nonces.Redeem(context.Background(), instance, nonce)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				wins++
				tokens = append(tokens, cred.Token)
				return
			}
			assert.ErrorIs(t, err, vmworker.ErrNonceRedeemed, "unexpected error")
		})
	}
	wg.Wait()
	require.Equal(t, 1, wins, "redemptions won (tokens %q)", tokens)
	require.Equal(t, "drc1.secret", tokens[0], "the winner's token")
}

func endpoint(t *testing.T, r rig) *vmworker.Endpoint {
	t.Helper()
	return endpointWith(t, r, func(*vmworker.EndpointConfig) {})
}

// endpointWith is endpoint with its configuration changed by mod.
func endpointWith(t *testing.T, r rig, mod func(*vmworker.EndpointConfig)) *vmworker.Endpoint {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gitea-runner")
	require.NoError(t, os.WriteFile(bin, []byte("runner"), 0o755))
	cfg := vmworker.EndpointConfig{
		Listen: "10.213.0.1:7001", Allowed: netip.MustParsePrefix("10.213.0.0/24"), FacadeCA: func() ([]byte, error) { return []byte("CA"), nil },
		Executor: executor.Config{
			FacadeURL: "https://10.213.0.1:8444", FacadeID: spiffeid.RequireFromString("spiffe://dynrunner.local/dynrunner/facade"),
			RunnerBin: bin, RunnerSHA256: "abc", RunnerVersion: "v1.0.8", Labels: []string{"vm:host"}, Renew: 30 * time.Second,
		},
		Log: zerolog.New(zerolog.NewTestWriter(t)),
	}
	mod(&cfg)
	e, err := vmworker.NewEndpoint(cfg, r.nonces, r.log)
	require.NoError(t, err)
	return e
}

func post(h http.Handler, remote string, body any) *httptest.ResponseRecorder {
	b, _ := json.Marshal(body)
	req := httptest.NewRequest(http.MethodPost, "/v1/redeem", bytes.NewReader(b))
	req.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func TestEndpoint(t *testing.T) {
	r := newRig(t)
	st := r.claimVM(t, 7)
	nonce, _ := vmworker.NewNonce()
	require.NoError(t, r.nonces.Issue(t.Context(), nonce, instance, 7, st.Epoch(), vmworker.Credential{Token: "drc1.tok"}))
	h := endpoint(t, r).Handler()
	guest := "10.213.0.17:40000"

	require.Equal(t, http.StatusForbidden, post(h, "127.0.0.1:5555", executor.RedeemRequest{InstanceID: instance, Nonce: nonce}).Code, "caller outside the bridge")
	for name, req := range map[string]executor.RedeemRequest{
		"bad instance id": {InstanceID: "../../etc", Nonce: nonce},
		// Only the canonical form a backend gives out, none of the others a UUID parser takes.
		"upper-case instance id":      {InstanceID: strings.ToUpper(instance), Nonce: nonce},
		"braced instance id":          {InstanceID: "{" + instance + "}", Nonce: nonce},
		"urn instance id":             {InstanceID: "urn:uuid:" + instance, Nonce: nonce},
		"instance id without hyphens": {InstanceID: strings.ReplaceAll(instance, "-", ""), Nonce: nonce},
		"nil instance id":             {InstanceID: "00000000-0000-0000-0000-000000000000", Nonce: nonce},
		"short nonce":                 {InstanceID: instance, Nonce: nonce[:15]},
		"bad nonce":                   {InstanceID: instance, Nonce: "a b;c"},
	} {
		assert.Equal(t, http.StatusBadRequest, post(h, guest, req).Code, name)
	}
	w := post(h, guest, executor.RedeemRequest{InstanceID: instance, Nonce: nonce})
	require.Equal(t, http.StatusOK, w.Code, "redeem: %s", w.Body)
	var g executor.Grant
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &g), "grant")
	require.Equal(t, executor.Grant{
		TaskID: 7, Epoch: uint64(st.Epoch()), Token: "drc1.tok",
		FacadeURL: "https://10.213.0.1:8444", FacadeSpiffeID: "spiffe://dynrunner.local/dynrunner/facade", FacadeCAPEM: "CA",
		RunnerPath: "/v1/runner", RunnerSHA256: "abc", RunnerVersion: "v1.0.8", Labels: []string{"vm:host"}, RenewSecs: 30,
	}, g)
	require.Equal(t, http.StatusGone, post(h, guest, executor.RedeemRequest{InstanceID: instance, Nonce: nonce}).Code, "reused nonce")
	req := httptest.NewRequest(http.MethodGet, "/v1/runner", nil)
	req.RemoteAddr = guest
	rw := httptest.NewRecorder()
	h.ServeHTTP(rw, req)
	require.Equal(t, http.StatusOK, rw.Code, "runner download")
	require.Equal(t, "runner", rw.Body.String(), "runner download")
}

func TestEndpointRefusesWildcardListen(t *testing.T) {
	r := newRig(t)
	for _, listen := range []string{"0.0.0.0:7001", "127.0.0.1:7001", "[::]:7001"} {
		_, err := vmworker.NewEndpoint(vmworker.EndpointConfig{Listen: listen, Allowed: netip.MustParsePrefix("10.213.0.0/24")}, r.nonces, r.log)
		assert.Error(t, err, "listen %s accepted", listen)
	}
}
