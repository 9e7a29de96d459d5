// Package natsconn connects dynrunner to NATS: an embedded nats-server with JetStream in the
// state directory (the single-node default) or an external server or cluster.
package natsconn

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Config selects the connection.
type Config struct {
	// URL of an external NATS; empty embeds a server.
	URL string
	// User and Password authenticate to an external NATS (the password comes from a file).
	User     string
	Password string
	// StoreDir holds the embedded server's JetStream data.
	StoreDir string
	// Listen is the loopback address the embedded server also serves, so operators can tail
	// the audit subjects with `nats` or `dynrunner events`; empty: in-process only. Clients
	// authenticate as User with Password.
	Listen string
	// Name identifies this connection to the server (shown by `nats server report connections`).
	Name string
}

// Conn is a NATS connection and, when embedded, its server.
type Conn struct {
	NC     *nats.Conn
	Server *server.Server
}

// The keepalive of a connection to an external NATS: a ping every externalPingInterval, the
// connection given up (and another server dialled) after externalMaxPingsOut unanswered.
const (
	externalPingInterval = 5 * time.Second
	externalMaxPingsOut  = 3
)

// Connect embeds or dials NATS.
func Connect(cfg Config) (*Conn, error) {
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
	}
	if cfg.URL != "" {
		// A server cut off without a reset (a partition, a host that died) leaves the
		// connection open but dead; every request on it times out until the client notices.
		// nats.go's default (a ping every 2 minutes, 2 unanswered) notices after 4 minutes;
		// this after at most 15 s, and then reconnects to another server of the URL.
		opts = append(opts, nats.PingInterval(externalPingInterval), nats.MaxPingsOutstanding(externalMaxPingsOut))
		if cfg.Password != "" {
			opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
		}
		if p := InboxPrefix(cfg.User); p != "" {
			opts = append(opts, nats.CustomInboxPrefix(p))
		}
		nc, err := nats.Connect(cfg.URL, opts...)
		if err != nil {
			return nil, fmt.Errorf("natsconn: connect %s: %w", redactURL(cfg.URL), err)
		}
		return &Conn{NC: nc}, nil
	}
	s, err := Embed(cfg.StoreDir, cfg.Listen, cfg.User, cfg.Password)
	if err != nil {
		return nil, err
	}
	if cfg.Password != "" {
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	nc, err := nats.Connect("", append(opts, nats.InProcessServer(s))...)
	if err != nil {
		s.Shutdown()
		return nil, fmt.Errorf("natsconn: connect to the embedded server: %w", err)
	}
	return &Conn{NC: nc, Server: s}, nil
}

// InboxPrefix is where a connection as user gets its replies on an external NATS:
// "_INBOX_<user>", so that each component's user may subscribe to its own replies only
// (deploy/nats/permissions.conf). It is "" (nats' shared "_INBOX") for no user, or a user name
// that is not a single subject token.
func InboxPrefix(user string) string {
	token := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
	}
	if user == "" || strings.ContainsFunc(user, func(r rune) bool { return !token(r) }) {
		return ""
	}
	return "_INBOX_" + user
}

// Embed starts an in-process nats-server with JetStream storing under dir. With listen empty
// it listens on no TCP port: only in-process connections reach it; otherwise it also serves
// listen (loopback only), where clients must authenticate as user with password.
func Embed(dir, listen, user, password string) (*server.Server, error) {
	if dir == "" {
		return nil, errors.New("natsconn: embedded server needs a store directory")
	}
	opts := &server.Options{
		ServerName:         "dynrunner-embedded",
		DontListen:         true,
		JetStream:          true,
		StoreDir:           filepath.Clean(dir),
		NoSigs:             true,
		NoLog:              true,
		JetStreamMaxMemory: 256 << 20,
	}
	if listen != "" {
		host, port, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, fmt.Errorf("natsconn: embedded listen address %q: %w", listen, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("natsconn: embedded listen address %q: the embedded server serves loopback only; use an external NATS for more", listen)
		}
		if user == "" || password == "" {
			return nil, errors.New("natsconn: an embedded server that listens needs a user and password")
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("natsconn: embedded listen port %q: %w", port, err)
		}
		opts.DontListen = false
		opts.Host, opts.Port = host, p
		opts.Username, opts.Password = user, password
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("natsconn: store directory: %w", err)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsconn: embedded server: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, errors.New("natsconn: embedded server not ready within 30s")
	}
	return s, nil
}

// Close drains the connection and stops an embedded server. It is idempotent.
func (c *Conn) Close() {
	if c.NC != nil && !c.NC.IsClosed() {
		_ = c.NC.Drain()
		for i := 0; i < 100 && !c.NC.IsClosed(); i++ {
			time.Sleep(20 * time.Millisecond)
		}
		c.NC.Close()
	}
	if c.Server != nil {
		c.Server.Shutdown()
		c.Server.WaitForShutdown()
	}
}

func redactURL(u string) string {
	// nats://user:pass@host → nats://user:REDACTED@host; passwords never reach a log or error.
	for i := 0; i+3 <= len(u); i++ {
		if u[i:i+3] == "://" {
			rest := u[i+3:]
			for j := 0; j < len(rest); j++ {
				if rest[j] == '@' {
					return u[:i+3] + "REDACTED@" + rest[j+1:]
				}
				if rest[j] == '/' {
					break
				}
			}
			break
		}
	}
	return u
}
