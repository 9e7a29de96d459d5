package githubtest_test

import (
	"testing"
	"time"

	"github.com/actions/scaleset"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
)

// FuzzMessageBody sends arbitrary message bodies through the fake to the unmodified client. The
// property: the client either refuses the message with an error or returns exactly that
// message (its id, its statistics), and the message stays queued until deleted.
func FuzzMessageBody(f *testing.F) {
	for _, seed := range []string{
		`[]`, ``, `null`, `[{"messageType":"JobAvailable","runnerRequestId":7,"requestLabels":["pod"]}]`,
		`[{"messageType":"JobStarted","runnerId":"x"}]`, `{"messageType":"JobAvailable"}`, `[{`, `"[]"`,
	} {
		f.Add(seed)
	}
	srv := githubtest.New(f, githubtest.Options{Tokens: []string{testPAT}, LongPollTimeout: 10 * time.Millisecond})
	ctx := f.Context()
	c, err := scaleset.NewClientWithPersonalAccessToken(scaleset.NewClientWithPersonalAccessTokenConfig{
		GitHubConfigURL: srv.OrgURL("octo"), PersonalAccessToken: testPAT,
	}, fastRetries(0))
	require.NoError(f, err)
	set, err := c.CreateRunnerScaleSet(ctx, &scaleset.RunnerScaleSet{Name: "fuzz", Labels: []scaleset.Label{{Name: "pod"}}})
	require.NoError(f, err)
	sess, err := c.MessageSessionClient(ctx, set.ID, "fuzz")
	require.NoError(f, err)

	f.Fuzz(func(t *testing.T, body string) {
		id, err := srv.QueueRawMessage(set.ID, "RunnerScaleSetJobMessages", body)
		require.NoError(t, err)
		msg, err := sess.GetMessage(t.Context(), id-1, 1)
		if err == nil {
			require.NotNil(t, msg)
			assert.Equal(t, id, msg.MessageID)
			assert.NotNil(t, msg.Statistics)
		}
		assert.Equal(t, 1, srv.PendingMessages(set.ID))
		require.NoError(t, sess.DeleteMessage(t.Context(), id))
		assert.Zero(t, srv.PendingMessages(set.ID))
	})
}
