package bench

import (
	"context"
	"io"
	"log"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/workload"
)

// What the plane, the plane hosts and the facade hosts wire alike, as cmd/dynrunner does.

// controllerLogger logs at info level as the controller does: every line is formatted, info
// lines are discarded and warnings and errors written to w (kept for the failure message).
func controllerLogger(w io.Writer) zerolog.Logger {
	logw := zerolog.MultiLevelWriter(
		zerolog.LevelWriterAdapter{Writer: io.Discard},
		&zerolog.FilteredLevelWriter{Writer: zerolog.LevelWriterAdapter{Writer: w}, Level: zerolog.WarnLevel},
	)
	return zerolog.New(logw).Level(zerolog.InfoLevel).With().Timestamp().Logger()
}

// openLog connects to the plane's JetStream and opens its event log with key and replicas.
// The caller closes the connection.
func openLog(ctx context.Context, ncfg natsconn.Config, key []byte, replicas int) (*natsconn.Conn, jetstream.JetStream, *eventlog.Log, error) {
	c, err := natsconn.Connect(ncfg)
	if err != nil {
		return nil, nil, nil, err
	}
	js, err := jetstream.New(c.NC)
	if err != nil {
		c.Close()
		return nil, nil, nil, err
	}
	cfg := eventlog.DefaultConfig()
	cfg.Key = key
	if replicas > 0 {
		cfg.Replicas = replicas
	}
	l, err := eventlog.Open(ctx, js, cfg)
	if err != nil {
		c.Close()
		return nil, nil, nil, err
	}
	return c, js, l, nil
}

// facadeServer serves f as the controller does: mTLS with an SVID ca issues the facade of td,
// valid for the loopback names.
func facadeServer(f *facade.Facade, ca *workload.DevCA, td spiffeid.TrustDomain) (*http.Server, error) {
	src, err := ca.ServerSource(workload.FacadeID(td), 24*time.Hour, workload.LocalHosts())
	if err != nil {
		return nil, err
	}
	return &http.Server{Handler: f.Handler(), TLSConfig: workload.ServerTLSConfig(src),
		ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}, nil
}
