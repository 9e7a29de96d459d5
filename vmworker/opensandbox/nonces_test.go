package opensandbox

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/vmworker"
)

// NewTestNonces returns the VM worker's real nonce store over an in-process JetStream of the
// test's own, and that JetStream (the tests count and break its bucket). Exported for the
// package's external tests.
func NewTestNonces(t testing.TB) (*vmworker.Nonces, jetstream.JetStream) {
	t.Helper()
	l, _, js := eventlogtest.OpenJetStream(t)
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	return vmworker.NewNonces(l.Nonces(), box), js
}
