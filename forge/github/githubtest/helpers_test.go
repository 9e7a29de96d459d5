package githubtest_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"sync"
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
)

const (
	testAppID          = 1234
	testClientID       = "Iv1.githubtest"
	testInstallationID = 42
	testPAT            = "ghp_githubtest"
)

// appKey is the test App's RSA key, generated once per test binary.
var appKey = sync.OnceValue(func() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
})

func pemKey(k *rsa.PrivateKey) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}))
}

// newServer starts a fake accepting the test App and testPAT, with a short long poll.
func newServer(t *testing.T, mod func(*githubtest.Options)) *githubtest.Server {
	t.Helper()
	opts := githubtest.Options{
		App:             &githubtest.App{ID: testAppID, ClientID: testClientID, InstallationID: testInstallationID, PublicKey: &appKey().PublicKey},
		Tokens:          []string{testPAT},
		LongPollTimeout: 50 * time.Millisecond,
	}
	if mod != nil {
		mod(&opts)
	}
	return githubtest.New(t, opts)
}

// fastRetries is a retrying HTTP client with millisecond backoff, so that retried faults do
// not cost the default second.
func fastRetries(retryMax int) scaleset.HTTPOption {
	c := retryablehttp.NewClient()
	c.RetryMax = retryMax
	c.RetryWaitMin = time.Millisecond
	c.RetryWaitMax = 5 * time.Millisecond
	return scaleset.WithRetryableHTTPClint(c)
}

// appClient is the unmodified scaleset client authenticating as the test App.
func appClient(t *testing.T, srv *githubtest.Server, opts ...scaleset.HTTPOption) *scaleset.Client {
	t.Helper()
	c, err := scaleset.NewClientWithGitHubApp(scaleset.ClientWithGitHubAppConfig{
		GitHubConfigURL: srv.RepoURL("octo", "hello"),
		GitHubAppAuth:   scaleset.GitHubAppAuth{ClientID: testClientID, InstallationID: testInstallationID, PrivateKey: pemKey(appKey())},
		SystemInfo:      scaleset.SystemInfo{System: "dynrunner-test"},
	}, append([]scaleset.HTTPOption{fastRetries(2)}, opts...)...)
	require.NoError(t, err)
	return c
}

// patClient is the unmodified scaleset client authenticating with token at organization octo.
func patClient(t *testing.T, srv *githubtest.Server, token string) *scaleset.Client {
	t.Helper()
	c, err := scaleset.NewClientWithPersonalAccessToken(scaleset.NewClientWithPersonalAccessTokenConfig{
		GitHubConfigURL:     srv.OrgURL("octo"),
		PersonalAccessToken: token,
		SystemInfo:          scaleset.SystemInfo{System: "dynrunner-test"},
	}, fastRetries(2))
	require.NoError(t, err)
	return c
}

var podLabels = []string{"self-hosted", "pod"}

// podScaleSet gets or creates the scale set for the pod tier.
func podScaleSet(ctx context.Context, t *testing.T, c *scaleset.Client) *scaleset.RunnerScaleSet {
	t.Helper()
	set, err := c.GetRunnerScaleSet(ctx, 1, "dynrunner-pod")
	require.NoError(t, err)
	if set != nil {
		return set
	}
	set, err = c.CreateRunnerScaleSet(ctx, &scaleset.RunnerScaleSet{
		Name:          "dynrunner-pod",
		RunnerGroupID: 1,
		Labels:        []scaleset.Label{{Name: "self-hosted"}, {Name: "pod"}},
	})
	require.NoError(t, err)
	return set
}

// nextMessage polls until a message comes, bounded by ctx; a nil answer (202) polls again.
func nextMessage(ctx context.Context, t *testing.T, sess *scaleset.MessageSessionClient, last int) *scaleset.RunnerScaleSetMessage {
	t.Helper()
	for ctx.Err() == nil {
		msg, err := sess.GetMessage(ctx, last, 2)
		require.NoError(t, err)
		if msg != nil {
			require.NoError(t, sess.DeleteMessage(ctx, msg.MessageID))
			return msg
		}
	}
	require.FailNow(t, "no message before the deadline")
	return nil
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}
