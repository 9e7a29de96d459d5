package githubtest_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/golang-jwt/jwt/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
)

func TestPersonalAccessToken(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := patClient(t, srv, testPAT)
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)
	require.NoError(t, sess.Close(ctx))
	counts := srv.Counts()
	assert.Equal(t, 0, counts.InstallationTokens, "a token needs no App exchange")
	assert.Equal(t, 1, counts.RegistrationTokens)
	assert.Equal(t, 1, counts.AdminTokens)
}

// TestCredentialsRefused is the attacker's side of authentication: every wrong credential is
// refused before any Actions-service state is touched.
func TestCredentialsRefused(t *testing.T) {
	otherKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	tests := []struct {
		name   string
		client func(t *testing.T, srv *githubtest.Server) *scaleset.Client
	}{
		{"wrong token", func(t *testing.T, srv *githubtest.Server) *scaleset.Client { return patClient(t, srv, "ghp_wrong") }},
		{"App key not the App's", func(t *testing.T, srv *githubtest.Server) *scaleset.Client {
			c, err := scaleset.NewClientWithGitHubApp(scaleset.ClientWithGitHubAppConfig{
				GitHubConfigURL: srv.RepoURL("octo", "hello"),
				GitHubAppAuth:   scaleset.GitHubAppAuth{ClientID: testClientID, InstallationID: testInstallationID, PrivateKey: pemKey(otherKey)},
			}, fastRetries(0))
			require.NoError(t, err)
			return c
		}},
		{"another App", func(t *testing.T, srv *githubtest.Server) *scaleset.Client {
			c, err := scaleset.NewClientWithGitHubApp(scaleset.ClientWithGitHubAppConfig{
				GitHubConfigURL: srv.RepoURL("octo", "hello"),
				GitHubAppAuth:   scaleset.GitHubAppAuth{ClientID: "Iv1.other", InstallationID: testInstallationID, PrivateKey: pemKey(appKey())},
			}, fastRetries(0))
			require.NoError(t, err)
			return c
		}},
		{"another installation", func(t *testing.T, srv *githubtest.Server) *scaleset.Client {
			c, err := scaleset.NewClientWithGitHubApp(scaleset.ClientWithGitHubAppConfig{
				GitHubConfigURL: srv.RepoURL("octo", "hello"),
				GitHubAppAuth:   scaleset.GitHubAppAuth{ClientID: testClientID, InstallationID: 7, PrivateKey: pemKey(appKey())},
			}, fastRetries(0))
			require.NoError(t, err)
			return c
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testContext(t)
			srv := newServer(t, nil)
			_, err := tt.client(t, srv).GetRunnerGroupByName(ctx, scaleset.DefaultRunnerGroup)
			require.Error(t, err)
			counts := srv.Counts()
			assert.Zero(t, counts.AdminTokens, "no admin token for a wrong credential")
			assert.Zero(t, counts.RegistrationTokens)
		})
	}
}

// TestAppJWTRules posts hand-made App JWTs: a lifetime over ten minutes, a wrong algorithm and
// an expired one are refused; the App's numeric id is accepted as issuer.
func TestAppJWTRules(t *testing.T) {
	srv := newServer(t, nil)
	now := time.Now()
	rs := func(iss string, iat, exp time.Time) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.RegisteredClaims{
			Issuer: iss, IssuedAt: jwt.NewNumericDate(iat), ExpiresAt: jwt.NewNumericDate(exp),
		}).SignedString(appKey())
		require.NoError(t, err)
		return tok
	}
	hs, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Issuer: testClientID, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(time.Minute)),
	}).SignedString([]byte("guessed"))
	require.NoError(t, err)
	tests := []struct {
		name string
		jwt  string
		want int
	}{
		{"numeric App id as issuer", rs(strconv.Itoa(testAppID), now.Add(-time.Minute), now.Add(8*time.Minute)), http.StatusCreated},
		{"lifetime over ten minutes", rs(testClientID, now.Add(-time.Minute), now.Add(time.Hour)), http.StatusUnauthorized},
		{"expired", rs(testClientID, now.Add(-20*time.Minute), now.Add(-11*time.Minute)), http.StatusUnauthorized},
		{"HMAC instead of RS256", hs, http.StatusUnauthorized},
		{"not a JWT", "ghp_notajwt", http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status := post(t, srv.URL()+"/api/v3/app/installations/"+strconv.Itoa(testInstallationID)+"/access_tokens", "Bearer "+tt.jwt, "")
			assert.Equal(t, tt.want, status)
		})
	}
}

// TestQueueTokensAreSessionBound shows message-queue and acquire calls refused without the
// scale set's own session token, even with a valid admin token or another scale set's token.
func TestQueueTokensAreSessionBound(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	pod := podScaleSet(ctx, t, c)
	vm, err := c.CreateRunnerScaleSet(ctx, &scaleset.RunnerScaleSet{Name: "dynrunner-vm", Labels: []scaleset.Label{{Name: "self-hosted"}, {Name: "vm"}}})
	require.NoError(t, err)
	podSess, err := c.MessageSessionClient(ctx, pod.ID, "replica-a")
	require.NoError(t, err)
	vmSess, err := c.MessageSessionClient(ctx, vm.ID, "replica-a")
	require.NoError(t, err)

	vmToken := "Bearer " + vmSess.Session().MessageQueueAccessToken
	podQueue := podSess.Session().MessageQueueURL
	assert.Equal(t, http.StatusUnauthorized, get(t, podQueue, vmToken), "another session's token")
	assert.Equal(t, http.StatusUnauthorized, get(t, podQueue, ""), "no token")
	acquire := srv.ActionsServiceURL() + "_apis/runtime/runnerscalesets/" + strconv.Itoa(pod.ID) + "/acquirejobs?api-version=6.0-preview"
	assert.Equal(t, http.StatusUnauthorized, post(t, acquire, vmToken, "[1]"), "acquiring with another scale set's token")
	assert.Equal(t, http.StatusUnauthorized, post(t, acquire, "Bearer forged", "[1]"))
	sets := srv.ActionsServiceURL() + "_apis/runtime/runnerscalesets?api-version=6.0-preview"
	assert.Equal(t, http.StatusUnauthorized, get(t, sets, "Bearer "+podSess.Session().MessageQueueAccessToken), "a queue token is no admin token")
}

func TestAdminTokenRefresh(t *testing.T) {
	ctx := testContext(t)
	// Under the client's one-minute margin, every call fetches a new admin token.
	srv := newServer(t, func(o *githubtest.Options) { o.AdminTokenTTL = 30 * time.Second })
	c := appClient(t, srv)
	for range 3 {
		_, err := c.GetRunnerGroupByName(ctx, scaleset.DefaultRunnerGroup)
		require.NoError(t, err)
	}
	counts := srv.Counts()
	assert.Equal(t, 3, counts.AdminTokens)
	assert.Equal(t, 3, counts.InstallationTokens, "the client fetches an installation token for each admin token")
	assert.Equal(t, 3, counts.RegistrationTokens)
}

func TestAdminTokensRevoked(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	_, err := c.GetRunnerGroupByName(ctx, scaleset.DefaultRunnerGroup)
	require.NoError(t, err)
	srv.ExpireAdminTokens()
	_, err = c.GetRunnerGroupByName(ctx, scaleset.DefaultRunnerGroup)
	require.ErrorContains(t, err, "401", "the client does not refresh a revoked admin token by itself")
	_, err = appClient(t, srv).GetRunnerGroupByName(ctx, scaleset.DefaultRunnerGroup)
	require.NoError(t, err, "a new client fetches a new admin token")
}

func TestSessionTokenRefresh(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, nil)
	c := appClient(t, srv)
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)
	jobID, err := srv.QueueJob(githubtest.JobSpec{Labels: podLabels})
	require.NoError(t, err)
	old := sess.Session().MessageQueueAccessToken

	srv.ExpireSessionTokens()
	msg := nextMessage(ctx, t, sess, 0)
	require.Len(t, msg.JobAvailableMessages, 1)
	assert.NotEqual(t, old, sess.Session().MessageQueueAccessToken, "the client refreshed the session on 401")

	srv.ExpireSessionTokens()
	acquired, err := sess.AcquireJobs(ctx, []int64{jobID})
	require.NoError(t, err)
	assert.Equal(t, []int64{jobID}, acquired)
	counts := srv.Counts()
	assert.Equal(t, 2, counts.SessionRefresh)
	assert.Equal(t, 3, counts.SessionTokens)
	assert.Len(t, srv.Sessions(), 1, "a refresh keeps the one session")
}

func get(t *testing.T, url, auth string) int { return do(t, http.MethodGet, url, auth, "") }

func post(t *testing.T, url, auth, body string) int { return do(t, http.MethodPost, url, auth, body) }

func do(t *testing.T, method, url, auth, body string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

// TestInstallationTokensExpire shows an expired installation token refused for a registration
// token, as after its hour on GitHub.
func TestInstallationTokensExpire(t *testing.T) {
	srv := newServer(t, nil)
	now := time.Now()
	appJWT, err := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.RegisteredClaims{
		Issuer: testClientID, IssuedAt: jwt.NewNumericDate(now.Add(-time.Minute)), ExpiresAt: jwt.NewNumericDate(now.Add(5 * time.Minute)),
	}).SignedString(appKey())
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL()+"/api/v3/app/installations/"+strconv.Itoa(testInstallationID)+"/access_tokens", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+appJWT)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var tok struct {
		Token string `json:"token"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&tok))
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	regURL := srv.URL() + "/api/v3/repos/octo/hello/actions/runners/registration-token"
	assert.Equal(t, http.StatusCreated, post(t, regURL, "Bearer "+tok.Token, ""))
	srv.ExpireInstallationTokens()
	assert.Equal(t, http.StatusUnauthorized, post(t, regURL, "Bearer "+tok.Token, ""))
}

// TestTLS runs the client over HTTPS with the fake's certificate, and shows it refusing the
// fake without that certificate.
func TestTLS(t *testing.T) {
	ctx := testContext(t)
	srv := newServer(t, func(o *githubtest.Options) { o.TLS = true })
	require.True(t, strings.HasPrefix(srv.URL(), "https://"))

	untrusting := patClient(t, srv, testPAT)
	_, err := untrusting.GetRunnerGroupByName(ctx, scaleset.DefaultRunnerGroup)
	var unknownCA x509.UnknownAuthorityError
	require.ErrorAs(t, err, &unknownCA)

	c, err := scaleset.NewClientWithPersonalAccessToken(scaleset.NewClientWithPersonalAccessTokenConfig{
		GitHubConfigURL: srv.RepoURL("octo", "hello"), PersonalAccessToken: testPAT,
	}, fastRetries(0), scaleset.WithRootCAs(srv.RootCAs()))
	require.NoError(t, err)
	set := podScaleSet(ctx, t, c)
	sess, err := c.MessageSessionClient(ctx, set.ID, "replica-a")
	require.NoError(t, err)
	_, err = srv.QueueJob(githubtest.JobSpec{Labels: podLabels})
	require.NoError(t, err)
	msg := nextMessage(ctx, t, sess, 0)
	require.Len(t, msg.JobAvailableMessages, 1)
	require.NoError(t, sess.Close(ctx))
}
