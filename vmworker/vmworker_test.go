package vmworker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
	if err != nil {
		t.Fatal(err)
	}
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	return rig{log: l, nonces: vmworker.NewNonces(l.Nonces(), box)}
}

const instance = "0f8fad5b-d9cb-469f-a165-70867728950e"

func (r rig) claimVM(t *testing.T, task assignment.TaskID) assignment.State {
	t.Helper()
	st, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: task, At: time.Now(), Actor: "test",
		Backend: assignment.BackendVM, TaskDigest: "d", Lease: 5 * time.Minute, Pickup: 2 * time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestNonceRedeemsOnceUnderRace(t *testing.T) {
	r := newRig(t)
	nonce, err := vmworker.NewNonce()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.nonces.Issue(t.Context(), nonce, instance, 5, 9, "drc1.secret"); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := r.nonces.Redeem(t.Context(), "11111111-2222-4333-8444-555555555555", nonce); !errors.Is(err, vmworker.ErrUnknownNonce) {
		t.Fatalf("redeem by another instance: %v, want ErrUnknownNonce", err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, tokens := 0, []string{}
	for range 8 {
		wg.Go(func() {
			_, _, tok, err := r.nonces.Redeem(context.Background(), instance, nonce)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
				tokens = append(tokens, tok)
			case !errors.Is(err, vmworker.ErrNonceRedeemed):
				t.Errorf("unexpected error: %v", err)
			}
		})
	}
	wg.Wait()
	if wins != 1 || tokens[0] != "drc1.secret" {
		t.Fatalf("%d redemptions won (tokens %q), want exactly 1", wins, tokens)
	}
}

func endpoint(t *testing.T, r rig) *vmworker.Endpoint {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gitea-runner")
	if err := os.WriteFile(bin, []byte("runner"), 0o755); err != nil {
		t.Fatal(err)
	}
	e, err := vmworker.NewEndpoint(vmworker.EndpointConfig{
		Listen: "10.213.0.1:7001", Allowed: netip.MustParsePrefix("10.213.0.0/24"), FacadeCA: func() ([]byte, error) { return []byte("CA"), nil },
		Executor: executor.Config{
			FacadeURL: "https://10.213.0.1:8444", FacadeID: spiffeid.RequireFromString("spiffe://dynrunner.local/dynrunner/facade"),
			RunnerBin: bin, RunnerSHA256: "abc", RunnerVersion: "v1.0.8", Labels: []string{"vm:host"}, Renew: 30 * time.Second,
		},
		Log: zerolog.New(zerolog.NewTestWriter(t)),
	}, r.nonces, r.log)
	if err != nil {
		t.Fatal(err)
	}
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
	if err := r.nonces.Issue(t.Context(), nonce, instance, 7, st.Epoch(), "drc1.tok"); err != nil {
		t.Fatal(err)
	}
	h := endpoint(t, r).Handler()
	guest := "10.213.0.17:40000"

	if w := post(h, "127.0.0.1:5555", executor.RedeemRequest{InstanceID: instance, Nonce: nonce}); w.Code != http.StatusForbidden {
		t.Fatalf("caller outside the bridge: %d, want 403", w.Code)
	}
	for name, req := range map[string]executor.RedeemRequest{
		"bad instance id": {InstanceID: "../../etc", Nonce: nonce},
		// Only the canonical form a backend gives out, none of the others a UUID parser takes.
		"upper-case instance id":      {InstanceID: strings.ToUpper(instance), Nonce: nonce},
		"braced instance id":          {InstanceID: "{" + instance + "}", Nonce: nonce},
		"urn instance id":             {InstanceID: "urn:uuid:" + instance, Nonce: nonce},
		"instance id without hyphens": {InstanceID: strings.ReplaceAll(instance, "-", ""), Nonce: nonce},
		"bad nonce":                   {InstanceID: instance, Nonce: "a b;c"},
	} {
		if w := post(h, guest, req); w.Code != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", name, w.Code)
		}
	}
	w := post(h, guest, executor.RedeemRequest{InstanceID: instance, Nonce: nonce})
	if w.Code != http.StatusOK {
		t.Fatalf("redeem: %d %s", w.Code, w.Body)
	}
	var g executor.Grant
	if err := json.Unmarshal(w.Body.Bytes(), &g); err != nil || g.Token != "drc1.tok" || g.TaskID != 7 || g.FacadeURL == "" {
		t.Fatalf("grant = %+v, %v", g, err)
	}
	require.Equal(t, executor.Grant{
		TaskID: 7, Epoch: uint64(st.Epoch()), Token: "drc1.tok",
		FacadeURL: "https://10.213.0.1:8444", FacadeSpiffeID: "spiffe://dynrunner.local/dynrunner/facade", FacadeCAPEM: "CA",
		RunnerPath: "/v1/runner", RunnerSHA256: "abc", RunnerVersion: "v1.0.8", Labels: []string{"vm:host"}, RenewSecs: 30,
	}, g)
	if w := post(h, guest, executor.RedeemRequest{InstanceID: instance, Nonce: nonce}); w.Code != http.StatusGone {
		t.Fatalf("reused nonce: %d, want 410", w.Code)
	}
	req := httptest.NewRequest(http.MethodGet, "/v1/runner", nil)
	req.RemoteAddr = guest
	rw := httptest.NewRecorder()
	h.ServeHTTP(rw, req)
	if rw.Code != http.StatusOK || rw.Body.String() != "runner" {
		t.Fatalf("runner download: %d %q", rw.Code, rw.Body)
	}
}

func TestEndpointRefusesWildcardListen(t *testing.T) {
	r := newRig(t)
	for _, listen := range []string{"0.0.0.0:7001", "127.0.0.1:7001", "[::]:7001"} {
		if _, err := vmworker.NewEndpoint(vmworker.EndpointConfig{Listen: listen, Allowed: netip.MustParsePrefix("10.213.0.0/24")}, r.nonces, r.log); err == nil {
			t.Errorf("listen %s accepted", listen)
		}
	}
}
