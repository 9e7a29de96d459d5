package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/forge/gitea"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/scheduler"
)

// planeHostVar, when set, makes this test binary a plane host: one controller replica of
// BenchmarkLifecyclesCluster. Its value is the replica's hostConfig as JSON.
const planeHostVar = "DYNRUNNER_BENCH_PLANE_HOST"

// Keys every replica shares, as replicas of one deployment share their key files.
var (
	clusterTaskKey   = []byte("0123456789abcdef0123456789abcdef")
	clusterCapKey    = []byte("fedcba9876543210fedcba9876543210")
	clusterRunnerKey = []byte("runner-key-runner-key-runner-key")
	clusterTD        = spiffeid.RequireTrustDomainFromString("bench.dynrunner")
)

// hostConfig is what a plane host runs against.
type hostConfig struct {
	Name                            string
	NATSURL, NATSUser, NATSPassword string
	// ForgeURL is the benchmark's fake forge, served over HTTP as Gitea's RunnerService.
	ForgeURL string
	// SecretsDir holds runner-uuid, runner-token (the resident runner's credentials, as the
	// controller reads GITEA_RUNNER_UUID_FILE and _TOKEN_FILE) and ca/, the shared development CA.
	SecretsDir  string
	Concurrency int
	// Profile is where to write a CPU profile from ready to stop; empty: none.
	Profile string
}

// hostResult is what a plane host reports on stdout when it stops: its own CPU time and what
// its no-op backend saw.
type hostResult struct {
	CPU     time.Duration
	Doubles int64
	// RegisterRetries counts Registers refused as an invalid transition and sent again.
	RegisterRetries int64
	Failed          int
	FirstErr        string
	Err             string
}

// planeHostMain runs in the child: a full plane (scheduler, facade, pod worker on a no-op
// backend whose environments run in this process) against an external NATS and the
// benchmark's forge. It prints "ready" once every component is, and its hostResult as one
// JSON line after SIGTERM.
func planeHostMain() int {
	enc := json.NewEncoder(os.Stdout)
	var cfg hostConfig
	if err := json.Unmarshal([]byte(os.Getenv(planeHostVar)), &cfg); err != nil {
		_ = enc.Encode(hostResult{Err: fmt.Sprintf("plane host: config: %v", err)})
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	res, err := runPlaneHost(ctx, cfg)
	if err != nil {
		res.Err = err.Error()
	}
	_ = enc.Encode(res)
	if err != nil {
		return 1
	}
	return 0
}

// runPlaneHost wires the components as plane.start does in process, on an R3 event log.
func runPlaneHost(ctx context.Context, cfg hostConfig) (hostResult, error) {
	c, js, l, err := openLog(ctx, natsconn.Config{URL: cfg.NATSURL, User: cfg.NATSUser, Password: cfg.NATSPassword, Name: cfg.Name}, clusterTaskKey, 3)
	if err != nil {
		return hostResult{}, err
	}
	defer c.Close()
	ca, err := workload.LoadOrCreateDevCA(filepath.Join(cfg.SecretsDir, "ca"), clusterTD)
	if err != nil {
		return hostResult{}, err
	}
	fg, err := gitea.Connect(ctx, gitea.Config{URL: cfg.ForgeURL, UUIDFile: filepath.Join(cfg.SecretsDir, "runner-uuid"),
		TokenFile: filepath.Join(cfg.SecretsDir, "runner-token"), Labels: []string{"self-hosted", "pod"}, Version: "bench"})
	if err != nil {
		return hostResult{}, err
	}
	box, err := sealbox.New(clusterTaskKey)
	if err != nil {
		return hostResult{}, err
	}
	issuer, err := captoken.NewIssuer(clusterCapKey)
	if err != nil {
		return hostResult{}, err
	}
	// The environments live in this process, so the facade needs only loopback.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return hostResult{}, err
	}
	target := facadeTarget{URL: "https://" + ln.Addr().String(), TD: clusterTD}
	// Info level, as the controller logs: every line is formatted; warnings and errors go to
	// stderr, which the benchmark keeps for its failure message.
	logger := controllerLogger(os.Stderr).With().Str("replica", cfg.Name).Logger()
	view := eventlog.NewView()
	var retries atomic.Int64
	backend := newLocalBackend(func(ctx context.Context, spec envSpec) error {
		var err error
		// On the R3 cluster a Register was now and then refused with "registered in phase
		// dispatched: invalid transition" although the environment launched only once its
		// `started` was in this replica's view: eventlog.Apply decided on a stale read (see
		// docs/benchmarks.md). The executor does not retry that refusal; this stand-in does,
		// at most 5 times, and counts it, so the benchmark measures the rest, logs what the
		// view and JetStream held, and then fails.
		for attempt := range 5 {
			if err = runEnv(ctx, target, spec, envFinish, nil); !registerRefused(err) {
				break
			}
			retries.Add(1)
			logger.Warn().Err(err).Int("attempt", attempt+1).Str("component", "environment").
				Str("view", viewState(view, spec.Task)).Str("jetstream", records(ctx, js, l, spec.Task)).
				Msg("register refused; retrying")
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		if err != nil && !errCancelled(ctx, err) {
			logger.Warn().Err(err).Str("component", "environment").Msg("environment failed")
		}
		return err
	})
	view.OnChange(backend.observe)
	w := podworker.New(podworker.Config{
		Actor: "pod-worker@" + cfg.Name, Tier: assignment.BackendPod, Concurrency: cfg.Concurrency,
		Issuer: issuer, Identity: devIdentity{ca}, Log: logger.With().Str("component", "pod-worker").Logger(),
		ExecutorEnv: map[string]string{"DYNRUNNER_FACADE_URL": target.URL}, Reap: reapInterval(),
	}, backend, l, view)
	s := scheduler.New(scheduler.Config{
		Actor: "scheduler@" + cfg.Name, Backends: []assignment.Backend{assignment.BackendPod},
		Lease: 5 * time.Minute, Pickup: 2 * time.Minute,
		FetchInterval: 10 * time.Millisecond, FetchIntervalMax: 100 * time.Millisecond,
		Keepalive: time.Minute, Reconcile: time.Second, Box: box,
		Log: logger.With().Str("component", "scheduler").Logger(),
	}, fg, l, view)
	f := facade.New(facade.Config{
		Actor: "facade@" + cfg.Name, TrustDomain: clusterTD, Lease: 5 * time.Minute, Issuer: issuer,
		RunnerKey: clusterRunnerKey, Box: box, Log: logger.With().Str("component", "facade").Logger(),
	}, fg, l, view)
	srv, err := facadeServer(f, ca, clusterTD)
	if err != nil {
		return hostResult{}, err
	}

	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = l.Watch(runCtx, view) })
	wg.Go(func() { _ = s.Run(runCtx) })
	wg.Go(func() { _ = w.Run(runCtx) })
	wg.Go(func() { _ = srv.ServeTLS(ln, "", "") })
	defer func() {
		cancel()
		_ = srv.Close()
		backend.Close()
		wg.Wait()
	}()
	for _, ch := range []<-chan struct{}{view.Ready(), s.Ready(), w.Ready()} {
		select {
		case <-ch:
		case <-ctx.Done():
			return hostResult{}, errors.New("plane host: stopped before ready")
		case <-time.After(2 * time.Minute):
			return hostResult{}, errors.New("plane host: not ready within 2m")
		}
	}
	if cfg.Profile != "" {
		pf, err := os.Create(cfg.Profile)
		if err != nil {
			return hostResult{}, err
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return hostResult{}, err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Println("ready")
	<-ctx.Done()
	pprof.StopCPUProfile() // before the shutdown, which the profile need not show
	res := hostResult{CPU: cpuTime(), Doubles: backend.doubles.Load(), RegisterRetries: retries.Load()}
	n, ferr := backend.launchErr()
	res.Failed = n
	if ferr != nil {
		res.FirstErr = ferr.Error()
	}
	return res, nil
}

// registerRefused reports whether err is the facade refusing a Register as an invalid
// transition of the assignment.
func registerRefused(err error) bool {
	return err != nil && connect.CodeOf(err) == connect.CodeFailedPrecondition &&
		strings.Contains(err.Error(), ": register: ") && strings.Contains(err.Error(), "invalid transition")
}

// viewState describes what the replica's view holds for task, for the refusal's log line.
func viewState(v *eventlog.View, task assignment.TaskID) string {
	st, ok := v.Get(task)
	if !ok {
		return "none"
	}
	return fmt.Sprintf("%s seq %d epoch %d", st.Phase, st.Seq, st.Epoch())
}

// records describes the task's assignment as JetStream holds it: what the log reads (Get), the
// sequence of the last message on each transition's subject, and Get again, for the refusal's
// log line.
func records(ctx context.Context, js jetstream.JetStream, l *eventlog.Log, task assignment.TaskID) string {
	var sb strings.Builder
	if st, err := l.Get(ctx, task); err != nil {
		fmt.Fprintf(&sb, "get: %v;", err)
	} else {
		fmt.Fprintf(&sb, "get: %s seq %d;", st.Phase, st.Seq)
	}
	stream, err := js.Stream(ctx, eventlog.StreamAssignments)
	if err != nil {
		return sb.String() + " " + err.Error()
	}
	for _, tr := range []assignment.Transition{assignment.Claimed, assignment.Dispatched, assignment.Started, assignment.Registered} {
		if m, err := stream.GetLastMsgForSubject(ctx, eventlog.RecordSubject(task, tr)); err == nil {
			fmt.Fprintf(&sb, " %s seq %d", tr, m.Sequence)
		} else {
			fmt.Fprintf(&sb, " %s: %v", tr, err)
		}
	}
	// Read again after those: a wildcard read that still lags them is no matter of timing.
	if st, err := l.Get(ctx, task); err == nil {
		fmt.Fprintf(&sb, "; get again: %s seq %d", st.Phase, st.Seq)
	}
	return sb.String()
}
