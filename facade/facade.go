package facade

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	pingv1 "code.gitea.io/actions-proto-go/ping/v1"
	"code.gitea.io/actions-proto-go/ping/v1/pingv1connect"
	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"
	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dynrunner/dynrunner/forge"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/logkey"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
	"github.com/dynrunner/dynrunner/internal/workload"
	dynrunnerv1 "github.com/dynrunner/dynrunner/proto/dynrunner/v1"
	"github.com/dynrunner/dynrunner/proto/dynrunner/v1/dynrunnerv1connect"
)

// Config configures the Facade.
type Config struct {
	Actor       string
	TrustDomain spiffeid.TrustDomain
	// Lease is the length a renewal extends the lease by.
	Lease time.Duration
	// Issuer verifies capability tokens; its key also derives the facade's runner tokens.
	Issuer    *captoken.Issuer
	RunnerKey []byte
	Box       *sealbox.Box
	Log       zerolog.Logger
	Now       func() time.Time
	Metrics   *Metrics
	// Limits bound what one caller can make the facade hold (see Server).
	Limits ServerLimits
}

// Facade is the RunnerService that environments talk to.
type Facade struct {
	cfg     Config
	limits  ServerLimits
	forge   forge.Forge
	log     EventLog
	view    View
	started time.Time
	// logLimit holds back refusal log lines beyond one per kind and HandshakeLogEvery.
	logLimit *logLimit
}

var (
	_ runnerv1connect.RunnerServiceHandler   = (*Facade)(nil)
	_ pingv1connect.PingServiceHandler       = (*Facade)(nil)
	_ dynrunnerv1connect.LeaseServiceHandler = (*Facade)(nil)
)

// New returns a Facade forwarding reports to forge.
func New(cfg Config, forge forge.Forge, log EventLog, view View) *Facade {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	f := &Facade{cfg: cfg, limits: cfg.Limits.withDefaults(), forge: forge, log: log, view: view, started: cfg.Now()}
	f.logLimit = &logLimit{every: f.limits.HandshakeLogEvery}
	return f
}

// Handler serves the RunnerService (at the path the Gitea runner uses, /api/actions/...), the
// PingService and the LeaseService. It must sit behind a TLS listener that requires client
// SVIDs (workload.ServerTLSConfig); every request is authorised by the caller's SPIFFE ID.
func (f *Facade) Handler() http.Handler {
	mux := f.mux()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := workload.PeerID(r)
		if err != nil {
			f.cfg.Metrics.Refused.WithLabelValues("no_identity").Inc()
			http.Error(w, "dynrunner facade: a client SVID is required", http.StatusUnauthorized)
			return
		}
		// The handshake checked the SVID; a connection kept open outlives it. Development-CA
		// SVIDs end with their assignment's lease: past it, the connection speaks for nobody.
		if leaf := r.TLS.PeerCertificates[0]; f.cfg.Now().After(leaf.NotAfter) {
			f.cfg.Metrics.Refused.WithLabelValues("svid_expired").Inc()
			w.Header().Set("Connection", "close")
			http.Error(w, fmt.Sprintf("dynrunner facade: the client SVID %s expired at %s; connect again with the current one",
				id, leaf.NotAfter.UTC().Format(time.RFC3339)), http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), peerKey{}, id)))
	})
}

// GuestHandler serves the same services to microVM guests, which have no SPIFFE identity
// until VM attestation exists. It must sit behind a server-authenticated TLS listener (the
// guest pins the facade's CA). A guest proves which assignment it serves with its single-use
// capability token at Register and with the runner credentials Register returned afterwards;
// only vm assignments are served here, so a pod environment never gets the weaker path.
func (f *Facade) GuestHandler() http.Handler {
	mux := f.mux()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), guestKey{}, true)))
	})
}

func (f *Facade) mux() *http.ServeMux {
	// Most messages are small; compressing them costs more than it saves. Log batches compress.
	// Every message is bounded after decompression: a small gzip body cannot inflate in memory.
	opts := connect.WithHandlerOptions(connect.WithCompressMinBytes(1024), connect.WithReadMaxBytes(f.limits.MaxMessageBytes))
	mux := http.NewServeMux()
	p, h := runnerv1connect.NewRunnerServiceHandler(f, opts)
	mux.Handle("/api/actions"+p, http.StripPrefix("/api/actions", h))
	p, h = pingv1connect.NewPingServiceHandler(f, opts)
	mux.Handle("/api/actions"+p, http.StripPrefix("/api/actions", h))
	p, h = dynrunnerv1connect.NewLeaseServiceHandler(f, opts)
	mux.Handle(p, h)
	return mux
}

type (
	peerKey  struct{}
	guestKey struct{}
)

// caller is the assignment a request is bound to: by the caller's SPIFFE ID, or for a
// microVM guest by its runner credentials.
type caller struct {
	id    string
	task  assignment.TaskID
	epoch assignment.Epoch
	guest bool
}

func isGuest(ctx context.Context) bool { return ctx.Value(guestKey{}) != nil }

// caller identifies the assignment a request is for. Register identifies guests by their
// capability token instead; see Register.
func (f *Facade) caller(ctx context.Context, method string, h http.Header) (caller, error) {
	f.cfg.Metrics.Reports.WithLabelValues(method).Inc()
	if isGuest(ctx) {
		task, epoch, ok := parseRunnerToken(h.Get("x-runner-token"))
		if !ok {
			return caller{}, f.refuse("bad_runner_token", connect.CodeUnauthenticated, errors.New("dynrunner facade: guest request without valid runner credentials"))
		}
		return caller{id: fmt.Sprintf("guest of task %d epoch %d", task, epoch), task: task, epoch: epoch, guest: true}, nil
	}
	id, ok := ctx.Value(peerKey{}).(spiffeid.ID)
	if !ok {
		return caller{}, f.refuse("no_identity", connect.CodeUnauthenticated, errors.New("dynrunner facade: no client SVID"))
	}
	task, epoch, err := workload.ParseAssignmentID(id, f.cfg.TrustDomain)
	if err != nil {
		return caller{}, f.refuse("wrong_identity", connect.CodePermissionDenied,
			fmt.Errorf("dynrunner facade: %s is not an assignment identity of trust domain %s", id, f.cfg.TrustDomain))
	}
	return caller{id: id.String(), task: task, epoch: epoch}, nil
}

func (f *Facade) refuse(reason string, code connect.Code, err error) error {
	f.cfg.Metrics.Refused.WithLabelValues(reason).Inc()
	if ok, suppressed := f.logLimit.allow(reason); ok {
		f.cfg.Log.Warn().Str("reason", reason).Err(err).Int("suppressed", suppressed).Msg("facade refused a request")
	}
	return connect.NewError(code, err)
}

// runnerToken derives the runner credential the facade hands out at Register: it names the
// assignment and epoch and carries an HMAC over them and the runner UUID, so nothing needs
// storing and a guest's later requests identify their assignment by it.
func (f *Facade) runnerToken(c caller, uuid string) string {
	m := hmac.New(sha256.New, f.cfg.RunnerKey)
	fmt.Fprintf(m, "dynrunner-runner-v1|%d|%d|%s", c.task, c.epoch, uuid)
	return fmt.Sprintf("%d.%d.%s", c.task, c.epoch, hex.EncodeToString(m.Sum(nil)))
}

// parseRunnerToken reads the assignment a runner token names; the HMAC is checked by runner.
func parseRunnerToken(tok string) (assignment.TaskID, assignment.Epoch, bool) {
	ts, rest, ok := strings.Cut(tok, ".")
	if !ok {
		return 0, 0, false
	}
	es, _, ok := strings.Cut(rest, ".")
	if !ok {
		return 0, 0, false
	}
	task, err1 := assignment.ParseTaskID(ts)
	epoch, err2 := assignment.ParseEpoch(es)
	return task, epoch, err1 == nil && err2 == nil
}

// runner authenticates the x-runner-uuid/x-runner-token headers of an assignment's runner and
// returns the assignment's current state, fenced by the caller's epoch.
func (f *Facade) runner(ctx context.Context, c caller, h http.Header) (assignment.State, error) {
	uuid, token := h.Get("x-runner-uuid"), h.Get("x-runner-token")
	if uuid == "" || !hmac.Equal([]byte(token), []byte(f.runnerToken(c, uuid))) {
		return assignment.State{}, f.refuse("bad_runner_token", connect.CodeUnauthenticated,
			fmt.Errorf("dynrunner facade: runner credentials not issued to %s", c.id))
	}
	// The view may not have seen the registration yet, nor a renewal made through another
	// facade: a refusal is decided on the assignment read again.
	st, err := f.load(ctx, c, func(st assignment.State) bool { return st.RunnerUUID == uuid && !f.leaseOver(st) })
	if err != nil {
		return st, err
	}
	if v := checkRunner(c, st, uuid, f.leaseOver(st)); v != nil {
		return st, f.answer(v)
	}
	return st, nil
}

// leaseOver reports whether st's lease has ended: the runner credentials and the SVID issued
// for it end with it. A facade that started less than assignment.RestartGrace ago lets
// environments renew a lease that ran out while no facade was up, as the scheduler does.
func (f *Facade) leaseOver(st assignment.State) bool {
	now := f.cfg.Now()
	return now.After(st.LeaseExpires) && now.Sub(f.started) >= assignment.RestartGrace(f.cfg.Lease)
}

// load is the one read of the caller's assignment every handler makes: current, then settle.
// settled says whether the handler can go on with what the view says (nil: whatever it says);
// a handler about to refuse, or to answer that there is nothing to do, on what the view says
// reads it again from JetStream first.
func (f *Facade) load(ctx context.Context, c caller, settled func(assignment.State) bool) (assignment.State, error) {
	st, err := f.current(ctx, c)
	if err != nil {
		return st, err
	}
	return f.settle(ctx, c, st, settled)
}

// settle returns st when settled accepts it (or is nil), else the assignment read again from
// JetStream (fresh).
func (f *Facade) settle(ctx context.Context, c caller, st assignment.State, settled func(assignment.State) bool) (assignment.State, error) {
	if settled == nil || settled(st) {
		return st, nil
	}
	return f.fresh(ctx, c)
}

// current reads the assignment and checks it is the caller's (checkAssignment).
//
// It answers from the view when the view knows the caller's epoch: the view is fed by the
// stream and by this facade's own appends, and every decision that changes the assignment is
// a compare-and-swap append anyway. Callers about to refuse on what the view says read again
// with fresh first (load, settle).
func (f *Facade) current(ctx context.Context, c caller) (assignment.State, error) {
	if st, ok := f.view.Get(c.task); ok && checkAssignment(c, st, nil) == nil {
		return st, nil
	}
	return f.fresh(ctx, c)
}

// fresh is current read from JetStream.
func (f *Facade) fresh(ctx context.Context, c caller) (assignment.State, error) {
	st, err := f.log.Get(ctx, c.task)
	if v := checkAssignment(c, st, err); v != nil {
		return st, f.answer(v)
	}
	return st, nil
}

// apply appends a transition on behalf of the caller, mapping state machine errors to codes.
func (f *Facade) apply(ctx context.Context, ev assignment.Event, hint *assignment.State) (assignment.State, error) {
	ev.Actor, ev.At = f.cfg.Actor, f.cfg.Now()
	st, err := f.log.Apply(ctx, ev, hint)
	switch {
	case err == nil:
		f.view.Observe(st)
		return st, nil
	case errors.Is(err, assignment.ErrNoChange):
		return st, err
	case errors.Is(err, assignment.ErrStaleEpoch):
		return st, f.refuse("stale_epoch", connect.CodeFailedPrecondition, fmt.Errorf("dynrunner facade: %w", err))
	case errors.Is(err, assignment.ErrTokenRedeemed):
		return st, f.refuse("token_replayed", connect.CodePermissionDenied, fmt.Errorf("dynrunner facade: %w", err))
	case errors.Is(err, assignment.ErrTokenMismatch):
		return st, f.refuse("token_mismatch", connect.CodePermissionDenied, fmt.Errorf("dynrunner facade: %w", err))
	case errors.Is(err, assignment.ErrTerminal), errors.Is(err, assignment.ErrInvalidTransition), errors.Is(err, assignment.ErrAlreadyFetched):
		return st, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("dynrunner facade: %w", err))
	}
	return st, connect.NewError(connect.CodeUnavailable, err)
}

// Ping implements the PingService the Gitea runner calls before registering.
func (f *Facade) Ping(ctx context.Context, req *connect.Request[pingv1.PingRequest]) (*connect.Response[pingv1.PingResponse], error) {
	if isGuest(ctx) {
		// The runner pings before it has credentials; a ping reveals nothing.
		f.cfg.Metrics.Reports.WithLabelValues("Ping").Inc()
	} else if _, err := f.caller(ctx, "Ping", req.Header()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pingv1.PingResponse{Data: "Hello, " + req.Msg.GetData() + "!"}), nil
}

// Register redeems the environment's single-use capability token, refusing it once it has
// expired (token_expired) unless this environment redeemed it already (registeredAgain).
func (f *Facade) Register(ctx context.Context, req *connect.Request[runnerv1.RegisterRequest]) (*connect.Response[runnerv1.RegisterResponse], error) {
	var c caller
	tok, terr := f.cfg.Issuer.Verify(req.Msg.GetToken())
	if isGuest(ctx) {
		// A guest has no SPIFFE ID: its capability token names the assignment.
		f.cfg.Metrics.Reports.WithLabelValues("Register").Inc()
		if terr == nil {
			c = caller{id: fmt.Sprintf("guest of task %d epoch %d", tok.Task(), tok.Epoch()), task: tok.Task(), epoch: tok.Epoch(), guest: true}
		}
	} else {
		var err error
		if c, err = f.caller(ctx, "Register", req.Header()); err != nil {
			return nil, err
		}
	}
	if terr != nil {
		return nil, f.refuse("bad_token", connect.CodeUnauthenticated, fmt.Errorf("dynrunner facade: registration token: %w", terr))
	}
	if tok.Task() != c.task || tok.Epoch() != c.epoch || tok.Purpose() != captoken.PurposeRegister {
		return nil, f.refuse("token_mismatch", connect.CodePermissionDenied,
			fmt.Errorf("dynrunner facade: token %s is not bound to %s", tok, c.id))
	}
	st, err := f.load(ctx, c, func(st assignment.State) bool { return checkRegister(c, st) == nil })
	if err != nil {
		return nil, err
	}
	if v := checkRegister(c, st); v != nil {
		return nil, f.answer(v)
	}
	key := req.Header().Get(RegisterKeyHeader)
	registered := func(uuid string) *connect.Response[runnerv1.RegisterResponse] {
		return connect.NewResponse(&runnerv1.RegisterResponse{Runner: &runnerv1.Runner{
			Id: int64(c.task), Uuid: uuid, Token: f.runnerToken(c, uuid), Name: req.Msg.GetName(),
			Labels: req.Msg.GetLabels(), Ephemeral: req.Msg.GetEphemeral(),
		}})
	}
	if uuid, ok := f.registeredAgain(c, st, tok, key); ok {
		f.cfg.Log.Info().Int64(logkey.TaskID, int64(c.task)).Uint64(logkey.Epoch, uint64(c.epoch)).
			Str("identity", c.id).Str("token_id", tok.ID()).Msg("environment's registration answered again (its first answer was lost)")
		return registered(uuid), nil
	}
	if tok.Expired(f.cfg.Now()) {
		// Only a first redemption is refused for expiry: the environment's own Register sent
		// again (above) is facade failover of a registered environment. The view may not show
		// that redemption yet: read again before refusing.
		if again, ferr := f.fresh(ctx, c); ferr == nil {
			if uuid, ok := f.registeredAgain(c, again, tok, key); ok {
				return registered(uuid), nil
			}
			st = again
		}
		return nil, f.refuse("token_expired", connect.CodeUnauthenticated, tokenExpired(tok, st))
	}
	uuid, err := f.runnerUUID(c, key)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	if _, err := f.apply(ctx, assignment.Event{Transition: assignment.Registered, Task: c.task, Epoch: c.epoch,
		TokenID: tok.ID(), RunnerUUID: uuid}, &st); err != nil {
		if errors.Is(err, assignment.ErrTokenRedeemed) {
			// Redeemed between our read and the append: by this very request's first attempt?
			if again, ferr := f.fresh(ctx, c); ferr == nil {
				if uuid, ok := f.registeredAgain(c, again, tok, key); ok {
					return registered(uuid), nil
				}
			}
		}
		if errors.Is(err, assignment.ErrNoChange) {
			err = connect.NewError(connect.CodeFailedPrecondition, err)
		}
		return nil, err
	}
	f.cfg.Log.Info().Int64(logkey.TaskID, int64(c.task)).Uint64(logkey.Epoch, uint64(c.epoch)).
		Str("identity", c.id).Str("token_id", tok.ID()).Msg("environment registered")
	return registered(uuid), nil
}

// tokenExpired is the error of a registration token presented after its expiry: the
// assignment's pickup deadline.
func tokenExpired(tok captoken.Token, st assignment.State) error {
	since := "claim"
	if !st.AdmittedAt.IsZero() {
		since = "admission"
	}
	return fmt.Errorf("dynrunner facade: registration token of task %d epoch %d expired at %s: the assignment's pickup deadline "+
		"(PICKUP_SECS, counted from its %s) passed before the environment registered",
		tok.Task(), tok.Epoch(), tok.Expires().Format(time.RFC3339), since)
}

// RegisterKeyHeader carries the register key: a secret the environment draws for its Register
// and keeps in memory (at least 32 hex digits). The facade derives the runner UUID from it
// (runnerUUID), so when the environment sends its Register again, to this facade or another,
// because the first answer was lost (the facade died mid-request), the facade can tell the
// same environment from anyone else holding the token (registeredAgain).
const RegisterKeyHeader = "x-dynrunner-register-key"

// runnerUUID is the UUID of the runner an environment registers: derived from the runner key,
// the assignment and the register key when the environment sent one, random otherwise.
func (f *Facade) runnerUUID(c caller, key string) (string, error) {
	if !validRegisterKey(key) {
		return newUUID()
	}
	m := hmac.New(sha256.New, f.cfg.RunnerKey)
	fmt.Fprintf(m, "dynrunner-runner-uuid-v1|%d|%d|%s", c.task, c.epoch, key)
	b := m.Sum(nil)[:16]
	b[6] = b[6]&0x0f | 0x80 // version 8: custom
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	u, err := uuid.FromBytes(b)
	if err != nil {
		return "", fmt.Errorf("dynrunner facade: uuid: %w", err)
	}
	return u.String(), nil
}

// registeredAgain decides a Register whose token st shows redeemed already: it is answered
// again, with the runner UUID returned, only when the redemption is this environment's own:
// the same token, and a runner UUID derived from the register key this request presents.
// Anyone else holding the token (without the register key, which never leaves the
// environment's memory but to the facade over TLS) is refused as a replay.
func (f *Facade) registeredAgain(c caller, st assignment.State, tok captoken.Token, key string) (string, bool) {
	if st.Phase != assignment.Registered && st.Phase != assignment.Running {
		return "", false
	}
	if !validRegisterKey(key) || st.TokenID != tok.ID() || st.RunnerUUID == "" {
		return "", false
	}
	want, err := f.runnerUUID(c, key)
	if err != nil || !hmac.Equal([]byte(want), []byte(st.RunnerUUID)) {
		return "", false
	}
	return want, true
}

// validRegisterKey reports whether key is a register key: 32 to 128 hex digits.
func validRegisterKey(key string) bool {
	if len(key) < 32 || len(key) > 128 {
		return false
	}
	_, err := hex.DecodeString(key)
	return err == nil
}

// Declare accepts the runner's labels; routing was decided when the task was claimed.
func (f *Facade) Declare(ctx context.Context, req *connect.Request[runnerv1.DeclareRequest]) (*connect.Response[runnerv1.DeclareResponse], error) {
	c, err := f.caller(ctx, "Declare", req.Header())
	if err != nil {
		return nil, err
	}
	st, err := f.runner(ctx, c, req.Header())
	if err != nil && connect.CodeOf(err) == connect.CodeUnavailable {
		// The assignment cannot be read now (JetStream fails over). The Gitea runner declares
		// once and exits when that fails, which would fail a job that is about to run for an
		// outage it would otherwise wait out. The credentials' HMAC, checked before the read,
		// shows this facade issued them to this runner for this assignment; Declare grants
		// nothing (routing was decided at the claim), and FetchTask checks the assignment.
		f.cfg.Log.Warn().Err(err).Int64(logkey.TaskID, int64(c.task)).Uint64(logkey.Epoch, uint64(c.epoch)).
			Msg("declare answered on the runner credentials alone: the assignment cannot be read now")
		st, err = assignment.State{}, nil
		st.RunnerUUID = req.Header().Get("x-runner-uuid")
	}
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&runnerv1.DeclareResponse{Runner: &runnerv1.Runner{
		Id: int64(c.task), Uuid: st.RunnerUUID, Labels: req.Msg.GetLabels(), Ephemeral: true,
	}}), nil
}

// FetchTask hands the assignment's task to its runner exactly once.
func (f *Facade) FetchTask(ctx context.Context, req *connect.Request[runnerv1.FetchTaskRequest]) (*connect.Response[runnerv1.FetchTaskResponse], error) {
	c, err := f.caller(ctx, "FetchTask", req.Header())
	if err != nil {
		return nil, err
	}
	st, err := f.runner(ctx, c, req.Header())
	if err != nil {
		return nil, err
	}
	empty := connect.NewResponse(&runnerv1.FetchTaskResponse{TasksVersion: req.Msg.GetTasksVersion()})
	if st, err = f.settle(ctx, c, st, func(st assignment.State) bool { return planFetch(st) == fetchHand }); err != nil {
		return nil, err
	}
	switch planFetch(st) {
	case fetchNothing:
		return empty, nil // ended: nothing to run
	case fetchAgain:
		task, err := f.openTask(ctx, c, st)
		if err != nil {
			return nil, err
		}
		f.cfg.Log.Info().Int64(logkey.TaskID, int64(c.task)).Uint64(logkey.Epoch, uint64(c.epoch)).Msg("task handed again to its runner")
		return connect.NewResponse(&runnerv1.FetchTaskResponse{Task: task, TasksVersion: req.Msg.GetTasksVersion()}), nil
	}
	task, err := f.openTask(ctx, c, st)
	if err != nil {
		return nil, err
	}
	if _, err := f.apply(ctx, assignment.Event{Transition: assignment.Running, Task: c.task, Epoch: c.epoch, RunnerUUID: st.RunnerUUID}, &st); err != nil {
		if errors.Is(err, assignment.ErrNoChange) || connect.CodeOf(err) == connect.CodeFailedPrecondition {
			return empty, nil
		}
		return nil, err
	}
	f.cfg.Log.Info().Int64(logkey.TaskID, int64(c.task)).Uint64(logkey.Epoch, uint64(c.epoch)).Msg("task handed to the environment")
	return connect.NewResponse(&runnerv1.FetchTaskResponse{Task: task, TasksVersion: req.Msg.GetTasksVersion()}), nil
}

// openTask reads and unseals the assignment's task.
func (f *Facade) openTask(ctx context.Context, c caller, st assignment.State) (*runnerv1.Task, error) {
	sealed, err := f.log.GetTask(ctx, c.task)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	task, err := sealedtask.Open(f.cfg.Box, c.task, sealed, st.TaskDigest)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return task, nil
}

// UpdateTask forwards the runner's state upstream and records the end of the job.
func (f *Facade) UpdateTask(ctx context.Context, req *connect.Request[runnerv1.UpdateTaskRequest]) (*connect.Response[runnerv1.UpdateTaskResponse], error) {
	c, err := f.caller(ctx, "UpdateTask", req.Header())
	if err != nil {
		return nil, err
	}
	st, err := f.runner(ctx, c, req.Header())
	if err != nil {
		return nil, err
	}
	if id := req.Msg.GetState().GetId(); id != int64(c.task) {
		return nil, f.refuse("wrong_task", connect.CodePermissionDenied, fmt.Errorf("dynrunner facade: report for task %d from the environment of task %d", id, c.task))
	}
	final := req.Msg.GetState().GetResult() != runnerv1.Result_RESULT_UNSPECIFIED
	result := strings.ToLower(strings.TrimPrefix(req.Msg.GetState().GetResult().String(), "RESULT_"))
	if err := f.reporting(ctx, c, &st); err != nil {
		if final && completedAs(st, result) {
			return f.finalAgain(c, req.Msg), nil
		}
		return nil, err
	}
	resp, err := f.forge.UpdateTask(ctx, req.Msg)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if final {
		if _, err := f.apply(ctx, assignment.Event{Transition: assignment.Completed, Task: c.task, Epoch: c.epoch, Result: result}, &st); err != nil && !errors.Is(err, assignment.ErrNoChange) {
			// Completed between our read and the append, by this report's first attempt?
			if again, ferr := f.fresh(ctx, c); ferr != nil || !completedAs(again, result) {
				return nil, err
			}
		}
		f.cfg.Log.Info().Int64(logkey.TaskID, int64(c.task)).Uint64(logkey.Epoch, uint64(c.epoch)).Str("result", result).Msg("job completed")
	}
	return connect.NewResponse(resp), nil
}

// completedAs reports whether st is the assignment completed with result: a final report of
// that result is one sent again after its first answer was lost.
func completedAs(st assignment.State, result string) bool {
	return st.Phase == assignment.Completed && st.Result == result
}

// finalAgain answers a final report sent again (completedAs) as the forge answered the first:
// the state, and every output sent (the runner sends the same state again). Nothing reaches
// the forge: it has the first.
func (f *Facade) finalAgain(c caller, msg *runnerv1.UpdateTaskRequest) *connect.Response[runnerv1.UpdateTaskResponse] {
	f.cfg.Log.Info().Int64(logkey.TaskID, int64(c.task)).Uint64(logkey.Epoch, uint64(c.epoch)).
		Msg("final report answered again, not forwarded (its first answer was lost)")
	sent := make([]string, 0, len(msg.GetOutputs()))
	for k := range msg.GetOutputs() {
		sent = append(sent, k)
	}
	slices.Sort(sent)
	return connect.NewResponse(&runnerv1.UpdateTaskResponse{
		State:       &runnerv1.TaskState{Id: int64(c.task), Result: msg.GetState().GetResult()},
		SentOutputs: sent,
	})
}

// reporting lets a report through only while the assignment runs (checkReporting). *st is read
// again from JetStream when the view does not say running.
func (f *Facade) reporting(ctx context.Context, c caller, st *assignment.State) error {
	settled, err := f.settle(ctx, c, *st, func(st assignment.State) bool { return checkReporting(c, st) == nil })
	if err != nil {
		return err
	}
	*st = settled
	if v := checkReporting(c, *st); v != nil {
		return f.answer(v)
	}
	return nil
}

// UpdateLog forwards log rows upstream.
func (f *Facade) UpdateLog(ctx context.Context, req *connect.Request[runnerv1.UpdateLogRequest]) (*connect.Response[runnerv1.UpdateLogResponse], error) {
	c, err := f.caller(ctx, "UpdateLog", req.Header())
	if err != nil {
		return nil, err
	}
	st, err := f.runner(ctx, c, req.Header())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetTaskId() != int64(c.task) {
		return nil, f.refuse("wrong_task", connect.CodePermissionDenied, fmt.Errorf("dynrunner facade: log for task %d from the environment of task %d", req.Msg.GetTaskId(), c.task))
	}
	if err := f.reporting(ctx, c, &st); err != nil {
		if st.Phase == assignment.Completed && len(req.Msg.GetRows()) == 0 {
			// The runner closing its log again (its final report's first answer was lost): it
			// adds nothing, and nothing is forwarded.
			return connect.NewResponse(&runnerv1.UpdateLogResponse{AckIndex: req.Msg.GetIndex()}), nil
		}
		return nil, err
	}
	resp, err := f.forge.UpdateLog(ctx, req.Msg)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(resp), nil
}

// Renew extends the lease of the caller's assignment.
func (f *Facade) Renew(ctx context.Context, req *connect.Request[dynrunnerv1.RenewRequest]) (*connect.Response[dynrunnerv1.RenewResponse], error) {
	c, err := f.caller(ctx, "Renew", req.Header())
	if err != nil {
		return nil, err
	}
	if c.guest {
		// A guest is known by its runner credentials alone: check them, not just their claim.
		if _, err := f.runner(ctx, c, req.Header()); err != nil {
			return nil, err
		}
	}
	if assignment.TaskID(req.Msg.GetTaskId()) != c.task || assignment.Epoch(req.Msg.GetEpoch()) != c.epoch {
		return nil, f.refuse("wrong_task", connect.CodePermissionDenied,
			fmt.Errorf("dynrunner facade: renewal for task %d epoch %d from %s", req.Msg.GetTaskId(), req.Msg.GetEpoch(), c.id))
	}
	// The view may be behind a renewal made through another facade (the environment failed
	// over while this one was cut off from NATS): a lease it says is over is read again.
	st, err := f.load(ctx, c, func(st assignment.State) bool { return !st.Active() || !f.leaseOver(st) })
	if err != nil {
		return nil, err
	}
	if ended, v := planRenew(c, st, f.leaseOver(st)); ended {
		return connect.NewResponse(&dynrunnerv1.RenewResponse{Ended: true, LeaseExpiresAt: timestamppb.New(st.LeaseExpires)}), nil
	} else if v != nil {
		return nil, f.answer(v)
	}
	next, err := f.apply(ctx, assignment.Event{Transition: assignment.Renewed, Task: c.task, Epoch: c.epoch, Lease: f.cfg.Lease}, &st)
	if err != nil {
		if errors.Is(err, assignment.ErrTerminal) || errors.Is(err, assignment.ErrInvalidTransition) {
			return connect.NewResponse(&dynrunnerv1.RenewResponse{Ended: true}), nil
		}
		return nil, err
	}
	return connect.NewResponse(&dynrunnerv1.RenewResponse{LeaseExpiresAt: timestamppb.New(next.LeaseExpires)}), nil
}

func newUUID() (string, error) {
	u, err := uuid.NewRandom()
	if err != nil {
		return "", fmt.Errorf("dynrunner facade: uuid: %w", err)
	}
	return u.String(), nil
}
