package spiretest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/internal/testbed/testproc"
)

// Version of SPIRE, kept in step with scripts/spire-tools.sh.
const Version = "v1.13.3"

// ToolsCommand builds the binaries Start runs.
const ToolsCommand = "bash scripts/spire-tools.sh"

// DockerSocket is the Docker engine's socket the agent's docker workload attestor asks about
// containers.
const DockerSocket = "/var/run/docker.sock"

// Timings the server and the agent are configured with.
const (
	// X509SVIDTTL is the server's default_x509_svid_ttl (the agent's own SVID lives as long).
	X509SVIDTTL = 10 * time.Minute
	// CacheReloadInterval is the server's experimental.cache_reload_interval: how often it
	// reloads the registration entries it hands agents (default 5s).
	CacheReloadInterval = 500 * time.Millisecond
	// SyncInterval is the agent's experimental.sync_interval: how often it fetches its
	// authorized entries from the server (default 5s).
	SyncInterval = 500 * time.Millisecond
)

// Bounds of the start-up and of a command line call.
const (
	serverReadyTimeout = 30 * time.Second
	agentReadyTimeout  = 30 * time.Second
	probeTimeout       = 5 * time.Second
	cliTimeout         = 30 * time.Second
	startAttempts      = 3
)

// SPIRE is a running spire-server and spire-agent. Start returns it; the test's cleanup stops
// both and removes Dir.
type SPIRE struct {
	// TrustDomain is the trust domain of the server and the agent.
	TrustDomain spiffeid.TrustDomain
	// ServerSocket is the path of the server's admin API socket (-socketPath of the
	// spire-server command line, or a unix address for the gRPC API).
	ServerSocket string
	// AgentSocketDir is a directory of mode 0755 holding nothing but the agent's Workload API
	// socket (mode 0777), to bind-mount into containers.
	AgentSocketDir string
	// AgentSocket is the path of the agent's Workload API socket, in AgentSocketDir.
	AgentSocket string
	// AgentID is the SPIFFE ID of the agent, attested with a join token: the parent ID of
	// the workload entries it serves.
	AgentID spiffeid.ID
	// Dir holds the configuration, data and logs (server.log, agent.log) of both.
	Dir string

	serverBin  string
	agentBin   string
	serverPort int
	server     *testproc.Process
	agent      *testproc.Process
}

// Binaries returns the paths of spire-server and spire-agent: $SPIRE_SERVER_BIN and
// $SPIRE_AGENT_BIN when set, else the cache scripts/spire-tools.sh fills ($DYNRUNNER_CACHE or
// $HOME/.cache/dynrunner, tools/spire-<version>). It checks that both exist.
func Binaries() (server, agent string, err error) {
	root := os.Getenv("DYNRUNNER_CACHE")
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", "", fmt.Errorf("spiretest: locate cache: %w", err)
		}
		root = filepath.Join(home, ".cache", "dynrunner")
	}
	dir := filepath.Join(root, "tools", "spire-"+Version)
	server = os.Getenv("SPIRE_SERVER_BIN")
	if server == "" {
		server = filepath.Join(dir, "spire-server")
	}
	agent = os.Getenv("SPIRE_AGENT_BIN")
	if agent == "" {
		agent = filepath.Join(dir, "spire-agent")
	}
	for _, bin := range []string{server, agent} {
		fi, err := os.Stat(bin)
		if err != nil {
			return "", "", fmt.Errorf("spiretest: %w", err)
		}
		if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
			return "", "", fmt.Errorf("spiretest: %s is not an executable file", bin)
		}
	}
	return server, agent, nil
}

// Start runs spire-server and spire-agent for trustDomain with their files in a new temporary
// directory and returns once both pass their health checks and the agent has attested. The
// test's cleanup stops both (logging the end of their logs when the test failed) and removes
// the directory. It skips the test (fails it when the environment variable CI is set) when
// the binaries are missing, and skips it with -short.
func Start(t *testing.T, trustDomain string) *SPIRE {
	t.Helper()
	if testing.Short() {
		t.Skip("spiretest: starts spire-server and spire-agent; run without -short")
	}
	td, err := spiffeid.TrustDomainFromString(trustDomain)
	if err != nil {
		t.Fatalf("spiretest: trust domain %q: %v", trustDomain, err)
	}
	serverBin, agentBin, err := Binaries()
	if err != nil {
		msg := fmt.Sprintf("%v; build spire-server and spire-agent %s with `%s` (about 8 minutes on two cores, once)",
			err, Version, ToolsCommand)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	began := time.Now()
	// Not t.TempDir: its path grows with the test's name, and a unix socket's path may not
	// exceed 107 bytes.
	dir, err := os.MkdirTemp("", "spiretest-")
	if err != nil {
		t.Fatalf("spiretest: %v", err)
	}
	s := &SPIRE{
		TrustDomain:    td,
		ServerSocket:   filepath.Join(dir, "server", "api.sock"),
		AgentSocketDir: filepath.Join(dir, "workload"),
		Dir:            dir,
		serverBin:      serverBin,
		agentBin:       agentBin,
	}
	s.AgentSocket = filepath.Join(s.AgentSocketDir, "agent.sock")
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			for _, p := range []*testproc.Process{s.server, s.agent} {
				if p != nil {
					t.Logf("spiretest: end of %s:\n%s", p.LogPath, p.Tail())
				}
			}
		}
		_ = os.RemoveAll(dir)
	})
	if err := s.prepare(); err != nil {
		t.Fatalf("spiretest: %v", err)
	}
	for attempt := 1; ; attempt++ {
		err = s.launchServer(t.Context())
		if err == nil {
			break
		}
		s.stop()
		if !errors.Is(err, testproc.ErrPortTaken) || attempt == startAttempts {
			t.Fatalf("spiretest: %v", err)
		}
	}
	if err := s.launchAgent(t.Context()); err != nil {
		t.Fatalf("spiretest: %v", err)
	}
	t.Logf("spiretest: SPIRE %s for %s ready in %v (agent %s)", Version, td, time.Since(began).Round(time.Millisecond), s.AgentID)
	return s
}

// EndpointSocket returns the agent's Workload API address in the form SPIFFE_ENDPOINT_SOCKET
// takes: "unix://" + AgentSocket.
func (s *SPIRE) EndpointSocket() string { return "unix://" + s.AgentSocket }

// prepare creates the directories. The top one is traversable by everyone, so that a
// non-root workload on the host reaches the agent's socket; the server's and the agent's
// data stay private.
func (s *SPIRE) prepare() error {
	if err := os.Chmod(s.Dir, 0o711); err != nil {
		return err
	}
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{
		{filepath.Join(s.Dir, "server"), 0o700},
		{filepath.Join(s.Dir, "agent"), 0o700},
		{s.AgentSocketDir, 0o755},
	} {
		if err := os.Mkdir(d.path, d.mode); err != nil {
			return err
		}
		if err := os.Chmod(d.path, d.mode); err != nil { // past the umask
			return err
		}
	}
	return nil
}

// launchServer writes the server's configuration for a new port, starts it and waits until
// its health check passes.
func (s *SPIRE) launchServer(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	dataDir := filepath.Join(s.Dir, "server")
	conf := fmt.Sprintf(`server {
	bind_address = "127.0.0.1"
	bind_port = "%d"
	socket_path = %s
	trust_domain = %s
	data_dir = %s
	log_level = "DEBUG"
	default_x509_svid_ttl = %s
	experimental {
		cache_reload_interval = %s
	}
}

plugins {
	DataStore "sql" {
		plugin_data {
			database_type = "sqlite3"
			connection_string = %s
		}
	}
	NodeAttestor "join_token" {
		plugin_data {}
	}
	KeyManager "memory" {
		plugin_data {}
	}
}
`, port, strconv.Quote(s.ServerSocket), strconv.Quote(s.TrustDomain.Name()), strconv.Quote(dataDir),
		strconv.Quote(X509SVIDTTL.String()), strconv.Quote(CacheReloadInterval.String()),
		strconv.Quote(filepath.Join(dataDir, "datastore.sqlite3")))
	confPath := filepath.Join(s.Dir, "server.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return err
	}
	s.serverPort = port
	s.server, err = testproc.Start("spire-server", filepath.Join(s.Dir, "server.log"), s.serverBin, "run", "-config", confPath)
	if err != nil {
		return err
	}
	return s.server.WaitReady(ctx, serverReadyTimeout, func(ctx context.Context) error {
		_, err := s.run(ctx, probeTimeout, s.serverBin, "healthcheck", "-socketPath", s.ServerSocket)
		return err
	})
}

// launchAgent generates a join token, writes the agent's configuration, starts it and waits
// until its health check passes.
func (s *SPIRE) launchAgent(ctx context.Context) error {
	out, err := s.run(ctx, cliTimeout, s.serverBin, "token", "generate", "-socketPath", s.ServerSocket, "-output", "json")
	if err != nil {
		return err
	}
	var token struct {
		Value string `json:"value"`
	}
	if err := json.Unmarshal(out, &token); err != nil {
		return fmt.Errorf("token generate: decode %q: %w", out, err)
	}
	if token.Value == "" {
		return fmt.Errorf("token generate: no token in %q", out)
	}
	s.AgentID, err = spiffeid.FromSegments(s.TrustDomain, "spire", "agent", "join_token", token.Value)
	if err != nil {
		return fmt.Errorf("agent ID: %w", err)
	}
	conf := fmt.Sprintf(`agent {
	data_dir = %s
	log_level = "DEBUG"
	server_address = "127.0.0.1"
	server_port = "%d"
	socket_path = %s
	trust_domain = %s
	insecure_bootstrap = true
	join_token = %s
	experimental {
		sync_interval = %s
	}
}

plugins {
	NodeAttestor "join_token" {
		plugin_data {}
	}
	KeyManager "memory" {
		plugin_data {}
	}
	WorkloadAttestor "unix" {
		plugin_data {
			discover_workload_path = true
		}
	}
	WorkloadAttestor "docker" {
		plugin_data {
			docker_socket_path = %s
		}
	}
}
`, strconv.Quote(filepath.Join(s.Dir, "agent")), s.serverPort, strconv.Quote(s.AgentSocket),
		strconv.Quote(s.TrustDomain.Name()), strconv.Quote(token.Value), strconv.Quote(SyncInterval.String()),
		strconv.Quote("unix://"+DockerSocket))
	confPath := filepath.Join(s.Dir, "agent.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return err
	}
	s.agent, err = testproc.Start("spire-agent", filepath.Join(s.Dir, "agent.log"), s.agentBin, "run", "-config", confPath)
	if err != nil {
		return err
	}
	return s.agent.WaitReady(ctx, agentReadyTimeout, func(ctx context.Context) error {
		_, err := s.run(ctx, probeTimeout, s.agentBin, "healthcheck", "-socketPath", s.AgentSocket)
		return err
	})
}

// stop stops the agent, then the server. It is idempotent.
func (s *SPIRE) stop() {
	if s.agent != nil {
		s.agent.Stop()
	}
	if s.server != nil {
		s.server.Stop()
	}
}

// run runs a command line of spire-server or spire-agent, bounded by timeout, and returns its
// standard output.
func (s *SPIRE) run(ctx context.Context, timeout time.Duration, bin string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err,
			bytes.TrimSpace(append(stderr.Bytes(), stdout.Bytes()...)))
	}
	return stdout.Bytes(), nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
