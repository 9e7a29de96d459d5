package vmworker_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/executor"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/launcher"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/vmworker"
)

const (
	testJIT   = "eyJqaXQiOiJjb25maWcifQ=="
	testToken = "drc1.secret"
	// slot is a GitHub slot's task id.
	slot = assignment.SlotBase + 17
)

// claimSlot records slot as claimed on the vm tier, as the scheduler does for a GitHub job.
func (r rig) claimSlot(t *testing.T) assignment.State {
	t.Helper()
	st, err := r.log.Apply(t.Context(), assignment.Event{Transition: assignment.Claimed, Task: slot, At: time.Now(), Actor: "test",
		Backend: assignment.BackendVM, Forge: assignment.ForgeGitHub, ScaleSet: 2, RunnerName: "dynrunner-vm-17",
		Lease: time.Hour, Pickup: 10 * time.Minute}, nil)
	require.NoError(t, err)
	return st
}

// TestNonceCredentialIsOneOfTwo: a nonce carries a capability token or a JIT configuration,
// never both and never neither; either redeems once, and neither is readable in the bucket.
func TestNonceCredentialIsOneOfTwo(t *testing.T) {
	r := newRig(t)
	for _, tc := range []struct {
		name string
		cred vmworker.Credential
	}{
		{"neither", vmworker.Credential{}},
		{"both", vmworker.Credential{Token: testToken, JITConfig: testJIT}},
	} {
		nonce, err := vmworker.NewNonce()
		require.NoError(t, err)
		err = r.nonces.Issue(t.Context(), nonce, instance, slot, 9, tc.cred)
		require.ErrorIs(t, err, vmworker.ErrCredential, tc.name)
		assert.NotContains(t, err.Error(), testToken, "%s: the error shows the token", tc.name)
		assert.NotContains(t, err.Error(), testJIT, "%s: the error shows the JIT configuration", tc.name)
		_, _, _, err = r.nonces.Redeem(t.Context(), instance, nonce)
		require.ErrorIs(t, err, vmworker.ErrUnknownNonce, "%s: a refused credential was recorded", tc.name)
	}

	for _, cred := range []vmworker.Credential{{Token: testToken}, {JITConfig: testJIT}} {
		nonce, err := vmworker.NewNonce()
		require.NoError(t, err)
		require.NoError(t, r.nonces.Issue(t.Context(), nonce, instance, slot, 9, cred))
		assert.Equal(t, cred.GitHub(), cred.JITConfig != "")
		keys, err := r.log.Nonces().ListKeys(t.Context())
		require.NoError(t, err)
		for k := range keys.Keys() {
			e, err := r.log.Nonces().Get(t.Context(), k)
			require.NoError(t, err)
			assert.NotContains(t, string(e.Value()), cred.Secret(), "the credential is in the nonce bucket unsealed")
		}
		task, epoch, got, err := r.nonces.Redeem(t.Context(), instance, nonce)
		require.NoError(t, err)
		assert.Equal(t, cred, got)
		assert.Equal(t, slot, task)
		assert.EqualValues(t, 9, epoch)
		_, _, _, err = r.nonces.Redeem(t.Context(), instance, nonce)
		require.ErrorIs(t, err, vmworker.ErrNonceRedeemed)
	}
}

// TestSpecCredential: a spec's credential is its capability token file or its JIT
// configuration file, exactly one.
func TestSpecCredential(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string][]byte
		want  vmworker.Credential
		err   error
	}{
		{"gitea", map[string][]byte{podworker.TokenFile: []byte(testToken), "svid.pem": []byte("x")}, vmworker.Credential{Token: testToken}, nil},
		{"github", map[string][]byte{executor.JITConfigFile: []byte(testJIT)}, vmworker.Credential{JITConfig: testJIT}, nil},
		{"both", map[string][]byte{podworker.TokenFile: []byte(testToken), executor.JITConfigFile: []byte(testJIT)}, vmworker.Credential{}, vmworker.ErrCredential},
		{"neither", map[string][]byte{"svid.pem": []byte("x")}, vmworker.Credential{}, vmworker.ErrCredential},
		{"empty token", map[string][]byte{podworker.TokenFile: nil}, vmworker.Credential{}, vmworker.ErrCredential},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := vmworker.SpecCredential(podworker.Spec{Task: slot, Epoch: 3, Files: tc.files})
			require.ErrorIs(t, err, tc.err)
			assert.Equal(t, tc.want, got)
			if err != nil {
				assert.NotContains(t, err.Error(), testToken)
				assert.NotContains(t, err.Error(), testJIT)
			}
		})
	}
}

// TestEndpointGrantsGitHubSlot: a GitHub slot's nonce redeems for a GitHub grant, its JIT
// configuration and the runner pinned in the guest image, with nothing of the facade; an
// endpoint without the GitHub runner's pin serves no GitHub slot.
func TestEndpointGrantsGitHubSlot(t *testing.T) {
	r := newRig(t)
	st := r.claimSlot(t)
	pin := executor.GitHubConfig{RunnerBin: "/opt/actions-runner/run.sh", RunnerSHA256: strings.Repeat("ab", 32)}
	nonce, _ := vmworker.NewNonce()
	require.NoError(t, r.nonces.Issue(t.Context(), nonce, instance, slot, st.Epoch(), vmworker.Credential{JITConfig: testJIT}))
	e := endpointWith(t, r, func(c *vmworker.EndpointConfig) { c.GitHub = pin })
	h := e.Handler()
	const guest = "10.213.0.17:40000"
	w := post(h, guest, executor.RedeemRequest{InstanceID: instance, Nonce: nonce})
	require.Equal(t, http.StatusOK, w.Code, "redeem: %s", w.Body)
	var g executor.Grant
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &g))
	require.True(t, g.IsGitHub(), "not a GitHub grant: %s", w.Body)
	assert.Empty(t, g.Token)
	assert.Empty(t, g.FacadeURL)
	assert.Empty(t, g.FacadeCAPEM)
	c, jit, err := g.GitHubConfig()
	require.NoError(t, err)
	assert.Equal(t, testJIT, jit)
	assert.Equal(t, executor.GitHubConfig{Task: slot, Epoch: st.Epoch(), RunnerBin: pin.RunnerBin, RunnerSHA256: pin.RunnerSHA256}, c)
	require.Equal(t, http.StatusGone, post(h, guest, executor.RedeemRequest{InstanceID: instance, Nonce: nonce}).Code, "reused nonce")

	// An endpoint that serves no GitHub slots refuses, and says so.
	nonce, _ = vmworker.NewNonce()
	require.NoError(t, r.nonces.Issue(t.Context(), nonce, instance, slot, st.Epoch(), vmworker.Credential{JITConfig: testJIT}))
	w = post(endpoint(t, r).Handler(), guest, executor.RedeemRequest{InstanceID: instance, Nonce: nonce})
	assert.Equal(t, http.StatusServiceUnavailable, w.Code)
	assert.Contains(t, w.Body.String(), "serves no GitHub slots")
	assert.NotContains(t, w.Body.String(), testJIT)
}

// TestBackendIssuesGitHubSlotsNonce: the VM backend starts a GitHub slot's launcher with a
// nonce for its JIT configuration, which never reaches the launcher; a spec with both
// credentials starts nothing.
func TestBackendIssuesGitHubSlotsNonce(t *testing.T) {
	r := newRig(t)
	procs := &launches{}
	b, err := vmworker.NewBackend(procs, r.nonces, "http://10.213.0.1:7001", nil)
	require.NoError(t, err)
	st := r.claimSlot(t)
	env := executor.GitHubConfig{Task: slot, Epoch: st.Epoch(), RunnerBin: "/opt/actions-runner/run.sh"}.Environ()
	_, err = b.Start(t.Context(), podworker.Spec{Task: slot, Epoch: st.Epoch(), Env: env,
		Files: map[string][]byte{executor.JITConfigFile: []byte(testJIT)}})
	require.NoError(t, err)
	require.Len(t, procs.specs, 1)
	spec := procs.specs[0]
	assert.Empty(t, spec.Files, "nothing secret reaches the launcher's directory")
	for k, v := range spec.Env {
		assert.NotContains(t, v, testJIT, "the launcher's %s holds the JIT configuration", k)
	}
	_, _, cred, err := r.nonces.Redeem(t.Context(), spec.Env[launcher.EnvInstanceID], spec.Env[launcher.EnvNonce])
	require.NoError(t, err)
	assert.Equal(t, vmworker.Credential{JITConfig: testJIT}, cred)

	_, err = b.Start(t.Context(), podworker.Spec{Task: slot, Epoch: st.Epoch(), Env: env,
		Files: map[string][]byte{executor.JITConfigFile: []byte(testJIT), podworker.TokenFile: []byte(testToken)}})
	require.ErrorIs(t, err, vmworker.ErrCredential)
	assert.Len(t, procs.specs, 1, "a launcher was started for a spec with two credentials")
}
