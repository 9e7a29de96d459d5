package githubtest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// App is the GitHub App the fake accepts: its JWTs must be signed with the private key of
// PublicKey and name ClientID or ID as issuer, and it is installed as InstallationID.
type App struct {
	ID             int64
	ClientID       string
	InstallationID int64
	PublicKey      *rsa.PublicKey
}

// Options configures a Server. The zero value accepts no credentials.
type Options struct {
	// App, when set, is the only GitHub App whose JWTs are accepted.
	App *App
	// Tokens are the accepted personal access tokens.
	Tokens []string
	// LongPollTimeout is how long a message poll waits before answering 202; 50 s if zero.
	LongPollTimeout time.Duration
	// AdminTokenTTL is the lifetime of the Actions-service admin token; one hour if zero. The
	// client refreshes it when less than a minute is left, so a TTL under a minute makes every
	// call fetch a new one.
	AdminTokenTTL time.Duration
	// AssignOnAcquire assigns acquired jobs to the scale set at once (a JobAssigned message), as
	// GitHub does on its own schedule; without it the test calls AssignJob.
	AssignOnAcquire bool
	// RunnerGroups are extra runner groups beside "Default" (id 1), numbered from 2.
	RunnerGroups []string
	// TLS serves HTTPS with a test certificate; give the client RootCAs (the stand-in runner
	// CertificatePEM). With Listener, the certificate is the fake's own and names the
	// listener's address (an IP SAN) beside loopback, so clients dialling that address verify it.
	TLS bool
	// SessionTimeout, when set, ends a session whose owner has not polled its queue for that
	// long, when another session of its scale set is asked for: GitHub times out the session of
	// a listener that died without deleting it (after some minutes; not documented). Zero: a
	// session lasts until deleted.
	SessionTimeout time.Duration
	// Listener, when set, is where the server listens instead of a new loopback port: an
	// address environments reach (a network namespace's, for a job container or a microVM
	// whose runner talks to the fake). URL and the JIT configurations name its address.
	Listener net.Listener
}

// Counts is how many credentials of each kind the fake has issued.
type Counts struct {
	InstallationTokens int
	RegistrationTokens int
	AdminTokens        int
	// SessionTokens counts message-queue tokens, issued on session create and refresh.
	SessionTokens   int
	SessionRefresh  int
	RejectedAuth    int
	InjectedFaults  int
	MessagesFetched int
}

// Server is the fake GitHub and Actions service. It is safe for concurrent use.
type Server struct {
	srv       *httptest.Server
	opts      Options
	adminKey  []byte
	done      chan struct{}
	closeOnce sync.Once

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced whenever a queue changes
	counts   Counts
	requests map[Op]int
	faults   map[Op][]Fault

	installTokens map[string]time.Time
	regTokens     map[string]time.Time
	adminTokens   map[string]bool // jti → valid

	groups     []runnerGroup
	scaleSets  map[int]*scaleSet
	nextSetID  int
	sessions   map[string]*session // by session id
	runners    map[int]*runner
	retired    map[int]*runner // runners gone because their job completed, by id
	nextRunner int
	jobs       map[int64]*job
	nextJob    int64
	runs       map[int64]*workflowRun
}

// New starts a Server on loopback and closes it when tb ends.
func New(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if opts.LongPollTimeout == 0 {
		opts.LongPollTimeout = 50 * time.Second
	}
	if opts.AdminTokenTTL == 0 {
		opts.AdminTokenTTL = time.Hour
	}
	s := &Server{
		opts:          opts,
		adminKey:      randomBytes(32),
		done:          make(chan struct{}),
		changed:       make(chan struct{}),
		requests:      map[Op]int{},
		faults:        map[Op][]Fault{},
		installTokens: map[string]time.Time{},
		regTokens:     map[string]time.Time{},
		adminTokens:   map[string]bool{},
		groups:        []runnerGroup{{ID: 1, Name: "Default", IsDefault: true}},
		scaleSets:     map[int]*scaleSet{},
		nextSetID:     1,
		sessions:      map[string]*session{},
		runners:       map[int]*runner{},
		retired:       map[int]*runner{},
		nextRunner:    1,
		jobs:          map[int64]*job{},
		nextJob:       1,
		runs:          map[int64]*workflowRun{},
	}
	for i, name := range opts.RunnerGroups {
		s.groups = append(s.groups, runnerGroup{ID: i + 2, Name: name})
	}
	s.srv = httptest.NewUnstartedServer(s.routes())
	if opts.Listener != nil {
		_ = s.srv.Listener.Close()
		s.srv.Listener = opts.Listener
	}
	s.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are what TLS tests want
	if opts.TLS {
		if opts.Listener != nil {
			cert, err := listenerCertificate(opts.Listener)
			if err != nil {
				tb.Fatal(err)
			}
			s.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		}
		s.srv.StartTLS()
	} else {
		s.srv.Start()
	}
	tb.Cleanup(s.Close)
	return s
}

// Close stops the server, ending open long polls first. It is idempotent.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		s.srv.Close()
	})
}

// URL is the server's base URL, http://127.0.0.1:port, or Options.Listener's address (https
// with Options.TLS).
func (s *Server) URL() string { return s.srv.URL }

// RootCAs is a pool holding the certificate the server presents with Options.TLS, for
// scaleset.WithRootCAs; nil without TLS.
func (s *Server) RootCAs() *x509.CertPool {
	if s.srv.Certificate() == nil {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AddCert(s.srv.Certificate())
	return pool
}

// RepoURL is the configuration URL of repository owner/repo, for the client's GitHubConfigURL.
func (s *Server) RepoURL(owner, repo string) string { return s.srv.URL + "/" + owner + "/" + repo }

// OrgURL is the configuration URL of organization org.
func (s *Server) OrgURL(org string) string { return s.srv.URL + "/" + org }

// EnterpriseURL is the configuration URL of enterprise name.
func (s *Server) EnterpriseURL(name string) string { return s.srv.URL + "/enterprises/" + name }

// ActionsServiceURL is the Actions-service URL the runner registration hands out.
func (s *Server) ActionsServiceURL() string { return s.srv.URL + actionsPrefix + "/" }

// Counts reports how many credentials the fake has issued and refused so far.
func (s *Server) Counts() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts
}

// Requests reports how many requests reached operation op, injected faults included.
func (s *Server) Requests(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[op]
}

// notifyLocked wakes every long poll; s.mu must be held.
func (s *Server) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return b
}

func randomToken(prefix string) string { return prefix + hex.EncodeToString(randomBytes(20)) }

const (
	githubPrefix  = "/api/v3"
	actionsPrefix = "/tenant"
	brokerPrefix  = "/broker"
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	gh := func(pattern string, op Op, h http.HandlerFunc) {
		mux.Handle(pattern, s.operation(op, h))
	}
	// GitHub REST API.
	gh("POST "+githubPrefix+"/app/installations/{id}/access_tokens", OpInstallationToken, s.handleInstallationToken)
	gh("POST "+githubPrefix+"/repos/{owner}/{repo}/actions/runners/registration-token", OpRegistrationToken, s.handleRegistrationToken)
	gh("POST "+githubPrefix+"/orgs/{org}/actions/runners/registration-token", OpRegistrationToken, s.handleRegistrationToken)
	gh("POST "+githubPrefix+"/enterprises/{ent}/actions/runners/registration-token", OpRegistrationToken, s.handleRegistrationToken)
	gh("POST "+githubPrefix+"/actions/runner-registration", OpRunnerRegistration, s.handleRunnerRegistration)
	gh("GET "+githubPrefix+"/repos/{owner}/{repo}/actions/runs/{run}", OpGetWorkflowRun, s.handleGetRun)
	gh("POST "+githubPrefix+"/repos/{owner}/{repo}/actions/runs/{run}/rerun-failed-jobs", OpRerunFailedJobs, s.handleRerunFailedJobs)

	// Actions service, authorised by the admin token.
	as := func(pattern string, op Op, h http.HandlerFunc) {
		mux.Handle(pattern, s.operation(op, s.admin(h)))
	}
	const sets = actionsPrefix + "/_apis/runtime/runnerscalesets"
	as("GET "+actionsPrefix+"/_apis/runtime/runnergroups/", OpGetRunnerGroup, s.handleGetRunnerGroup)
	as("GET "+sets, OpGetScaleSet, s.handleListScaleSets)
	as("POST "+sets, OpCreateScaleSet, s.handleCreateScaleSet)
	as("GET "+sets+"/{id}", OpGetScaleSet, s.handleGetScaleSet)
	as("PATCH "+sets+"/{id}", OpUpdateScaleSet, s.handleUpdateScaleSet)
	as("DELETE "+sets+"/{id}", OpDeleteScaleSet, s.handleDeleteScaleSet)
	as("POST "+sets+"/{id}/sessions", OpCreateSession, s.handleCreateSession)
	as("PATCH "+sets+"/{id}/sessions/{sid}", OpRefreshSession, s.handleRefreshSession)
	as("DELETE "+sets+"/{id}/sessions/{sid}", OpDeleteSession, s.handleDeleteSession)
	as("POST "+sets+"/{id}/generatejitconfig", OpGenerateJITConfig, s.handleGenerateJITConfig)
	const agents = actionsPrefix + "/_apis/distributedtask/pools/0/agents"
	as("GET "+agents, OpGetRunner, s.handleGetRunnerByName)
	as("GET "+agents+"/{id}", OpGetRunner, s.handleGetRunner)
	as("DELETE "+agents+"/{id}", OpRemoveRunner, s.handleRemoveRunner)

	// Authorised by the session's message-queue token instead.
	mux.Handle("POST "+sets+"/{id}/acquirejobs", s.operation(OpAcquireJobs, s.apiVersion(s.handleAcquireJobs)))
	mux.Handle("GET "+brokerPrefix+"/sessions/{sid}/messages", s.operation(OpGetMessage, s.handleGetMessage))
	mux.Handle("DELETE "+brokerPrefix+"/sessions/{sid}/messages/{mid}", s.operation(OpDeleteMessage, s.handleDeleteMessage))

	// The stand-in protocol (package standin), authorised by the runner's JIT credential; not GitHub's.
	const standIn = actionsPrefix + "/_standin/runners/{id}"
	mux.Handle("POST "+standIn+"/job", s.operation(OpStandInTakeJob, s.handleStandInTakeJob))
	mux.Handle("POST "+standIn+"/jobs/{jobid}/complete", s.operation(OpStandInComplete, s.handleStandInComplete))

	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeException(w, http.StatusNotFound, "NotFoundException", "githubtest: no route for "+r.Method+" "+r.URL.Path)
	})
	return mux
}
