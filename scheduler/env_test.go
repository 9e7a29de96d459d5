package scheduler_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/forgetest"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/eventlog/eventlogtest"
	"github.com/dynrunner/dynrunner/internal/sealbox"
)

// env is one control plane under test: JetStream, a view, the task key and a forge.
type env struct {
	t   *testing.T
	log *eventlog.Log
	// js is the JetStream the log was opened on, for writes around the log.
	js    jetstream.JetStream
	view  *eventlog.View
	box   *sealbox.Box
	forge *forgetest.Forge
}

func newEnv(t *testing.T) *env {
	t.Helper()
	l, v, js := eventlogtest.OpenJetStream(t)
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	return &env{t: t, log: l, js: js, view: v, box: box, forge: forgetest.New()}
}
