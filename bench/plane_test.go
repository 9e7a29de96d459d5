package bench

import (
	"context"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/facade"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/captoken"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker"
	"github.com/dynrunner/dynrunner/scheduler"
)

// The plane's keys, which a facade host shares.
var (
	benchTaskKey   = []byte("0123456789abcdef0123456789abcdef")
	benchCapKey    = []byte("fedcba9876543210fedcba9876543210")
	benchRunnerKey = []byte("runner-key-runner-key-runner-key")
	benchTD        = spiffeid.RequireTrustDomainFromString("bench.dynrunner")
)

// planeConfig sizes an in-process control plane.
type planeConfig struct {
	Concurrency   int
	Lease, Pickup time.Duration
	// NoFacade leaves the facade out: it runs in another process (a facade host), which
	// the environments reach at the plane's target.
	NoFacade bool
}

// reapInterval is the pod worker's reap interval in these benchmarks: an hour, so that its
// sweep does not race with starts (see noopBackend.checkDoubles), unless $BENCH_REAP sets
// another (BENCH_REAP=50ms reproduces the race within one run of BenchmarkMemory10k).
func reapInterval() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("BENCH_REAP")); err == nil && d > 0 {
		return d
	}
	return time.Hour
}

// plane is the controller of `COMPONENTS=all` on embedded defaults, wired in-process as
// cmd/dynrunner does: embedded JetStream, one view, the scheduler against a fakeForge, the
// facade serving mTLS on loopback with a development CA, and a pod worker. Only the forge and
// the backend are stand-ins.
type plane struct {
	b  *testing.B
	nc *natsconn.Conn
	// natsListen is the embedded server's loopback address, if it serves one.
	natsListen string
	// caDir holds the development CA, which a facade host loads too.
	caDir  string
	js     jetstream.JetStream
	log    *eventlog.Log
	view   *eventlog.View
	forge  *fakeForge
	ca     *workload.DevCA
	ln     net.Listener
	target facadeTarget
	// logPath holds the components' warnings and errors.
	logPath string

	changed chan struct{}
	apiReqs apiCounter

	mu    sync.Mutex
	seen  map[assignment.Transition]int       // transitions the view saw, by kind
	lastT map[assignment.Transition]time.Time // when it saw the last of each kind
}

// newPlane starts JetStream and opens the event log; start adds the components.
func newPlane(b *testing.B) *plane {
	b.Helper()
	return openPlane(b, natsconn.Config{StoreDir: b.TempDir(), Name: "bench"})
}

// Credentials of the embedded server's loopback listener, where newListeningPlane serves it.
const (
	planeNATSUser     = "bench"
	planeNATSPassword = "bench-nats-password"
)

// newListeningPlane is newPlane with the embedded server also served on a loopback port, so
// that components in other processes reach it as they reach an external NATS.
func newListeningPlane(b *testing.B) *plane {
	b.Helper()
	p := openPlane(b, natsconn.Config{StoreDir: b.TempDir(), Name: "bench", Listen: fmt.Sprintf("127.0.0.1:%d", freePorts(b, 1)[0]),
		User: planeNATSUser, Password: planeNATSPassword})
	return p
}

func openPlane(b *testing.B, natsCfg natsconn.Config) *plane {
	b.Helper()
	c, js, l, err := openLog(b.Context(), natsCfg, benchTaskKey, 0)
	require.NoError(b, err)
	b.Cleanup(c.Close)
	td := benchTD
	caDir := b.TempDir()
	ca, err := workload.LoadOrCreateDevCA(caDir, td)
	require.NoError(b, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	p := &plane{b: b, nc: c, natsListen: natsCfg.Listen, js: js, log: l, view: eventlog.NewView(), forge: newFakeForge(), ca: ca, caDir: caDir, ln: ln,
		target: facadeTarget{URL: "https://" + ln.Addr().String(), TD: td}, changed: make(chan struct{}, 1),
		seen: make(map[assignment.Transition]int), lastT: make(map[assignment.Transition]time.Time)}
	p.view.OnChange(p.count)
	// A plain subscriber sees every JetStream API request (reads: last-message lookups, KV
	// gets, consumer pulls), which publishes and acks are not.
	sub, err := c.NC.Subscribe("$JS.API.>", p.apiReqs.count)
	require.NoError(b, err)
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	return p
}

// count is a View.OnChange subscriber; the view calls it once per new state.
func (p *plane) count(st assignment.State) {
	now := time.Now()
	p.mu.Lock()
	p.seen[st.Transition]++
	p.lastT[st.Transition] = now
	p.mu.Unlock()
	p.poke()
}

// poke wakes waitFor to check its condition again.
func (p *plane) poke() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// seenOf returns how many tr transitions the view saw and when it saw the last.
func (p *plane) seenOf(tr assignment.Transition) (int, time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[tr], p.lastT[tr]
}

func (p *plane) n(tr assignment.Transition) int {
	n, _ := p.seenOf(tr)
	return n
}

// waitFor blocks until cond holds, polling on every counted transition, or fails the benchmark
// after limit with what diag says.
func (p *plane) waitFor(limit time.Duration, cond func() bool, diag func() string) {
	p.b.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for !cond() {
		select {
		case <-p.changed:
		case <-tick.C:
		case <-deadline.C:
			p.b.Fatalf("not done within %s: %s", limit, diag())
		}
	}
}

// start runs the scheduler, the facade and a pod worker on backend until the benchmark ends.
func (p *plane) start(cfg planeConfig, backend *noopBackend) {
	p.b.Helper()
	box, err := sealbox.New(benchTaskKey)
	require.NoError(p.b, err)
	issuer, err := captoken.NewIssuer(benchCapKey)
	require.NoError(p.b, err)
	// Info level, as the controller logs: every line is formatted; warnings and errors are
	// kept in a file for the failure message, the rest is discarded.
	logf, err := os.Create(filepath.Join(p.b.TempDir(), "controller.log"))
	require.NoError(p.b, err)
	p.b.Cleanup(func() { _ = logf.Close() })
	p.logPath = logf.Name()
	logger := controllerLogger(logf)
	pods := []assignment.Backend{assignment.BackendPod}

	p.view.OnChange(backend.observe)
	w := podworker.New(podworker.Config{
		Actor: "pod-worker@bench", Tier: assignment.BackendPod, Concurrency: cfg.Concurrency,
		Issuer: issuer, Identity: devIdentity{p.ca}, Log: logger.With().Str("component", "pod-worker").Logger(),
		ExecutorEnv: map[string]string{"DYNRUNNER_FACADE_URL": p.target.URL}, Reap: reapInterval(),
	}, backend, p.log, p.view)
	s := scheduler.New(scheduler.Config{
		Actor: "scheduler@bench", Backends: pods, Lease: cfg.Lease, Pickup: cfg.Pickup,
		// Polled every 10 ms so an idle poll never sits in the measured time; the controller's
		// default is FETCH_INTERVAL=1s, which only matters while the forge has no task.
		FetchInterval: 10 * time.Millisecond, FetchIntervalMax: 100 * time.Millisecond,
		Keepalive: time.Minute, Reconcile: time.Second, Box: box,
		Log: logger.With().Str("component", "scheduler").Logger(),
	}, p.forge, p.log, p.view)
	// The facade, unless a facade host serves it; srv then serves nothing.
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	if !cfg.NoFacade {
		f := facade.New(facade.Config{
			Actor: "facade@bench", TrustDomain: p.target.TD, Lease: cfg.Lease, Issuer: issuer,
			RunnerKey: benchRunnerKey, Box: box,
			Log: logger.With().Str("component", "facade").Logger(),
		}, p.forge, p.log, p.view)
		srv, err = facadeServer(f, p.ca, p.target.TD)
		require.NoError(p.b, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.log.Watch(ctx, p.view) })
	wg.Go(func() { _ = s.Run(ctx) })
	wg.Go(func() { _ = w.Run(ctx) })
	if cfg.NoFacade {
		_ = p.ln.Close()
	} else {
		wg.Go(func() { _ = srv.ServeTLS(p.ln, "", "") })
	}
	p.b.Cleanup(func() {
		cancel()
		_ = srv.Close()
		backend.Close()
		wg.Wait()
	})
	for _, c := range []<-chan struct{}{p.view.Ready(), s.Ready(), w.Ready()} {
		select {
		case <-c:
		case <-time.After(30 * time.Second):
			p.b.Fatal("control plane not ready within 30s")
		}
	}
}

// devIdentity issues environments their SVID files from the development CA, as the
// controller does with POD_BACKEND=local and no SPIFFE_ENDPOINT_SOCKET.
type devIdentity struct{ ca *workload.DevCA }

func (d devIdentity) Files(task assignment.TaskID, epoch assignment.Epoch, notAfter time.Time) (map[string][]byte, error) {
	svid, err := d.ca.Issue(workload.AssignmentID(d.ca.TrustDomain(), task, epoch), time.Until(notAfter))
	if err != nil {
		return nil, err
	}
	cert, key, err := svid.Marshal()
	if err != nil {
		return nil, err
	}
	bundle, err := d.ca.Bundle().Marshal()
	if err != nil {
		return nil, err
	}
	return map[string][]byte{workload.SVIDFile: cert, workload.SVIDKeyFile: key, workload.BundleFile: bundle}, nil
}

// jsCounts are JetStream counters: the last sequence of each of dynrunner's streams (one per
// write) and the JetStream API requests made.
type jsCounts struct {
	assignments, dispatch, tasks, live, workers, envs, api uint64
}

func (c jsCounts) writes() uint64 {
	return c.assignments + c.dispatch + c.tasks + c.live + c.workers + c.envs
}

func (c jsCounts) sub(o jsCounts) jsCounts {
	return jsCounts{c.assignments - o.assignments, c.dispatch - o.dispatch, c.tasks - o.tasks,
		c.live - o.live, c.workers - o.workers, c.envs - o.envs, c.api - o.api}
}

func (p *plane) counts() jsCounts {
	p.b.Helper()
	js := p.js
	last := func(name string) uint64 {
		s, err := js.Stream(context.Background(), name)
		require.NoError(p.b, err)
		info, err := s.Info(context.Background())
		require.NoError(p.b, err)
		return info.State.LastSeq
	}
	api, _ := p.apiReqs.snapshot()
	return jsCounts{
		assignments: last(eventlog.StreamAssignments),
		dispatch:    last(eventlog.StreamDispatch),
		tasks:       last("KV_" + eventlog.BucketTasks),
		live:        last("KV_" + eventlog.BucketLive),
		workers:     last("KV_" + eventlog.BucketWorkers),
		envs:        last(eventlog.StreamEnvironments),
		api:         uint64(api),
	}
}

// String describes the plane's progress for a failure message: transitions seen, a few
// assignments still live, and the last warnings the components logged.
func (p *plane) String() string {
	p.mu.Lock()
	seen := maps.Clone(p.seen)
	p.mu.Unlock()
	live := p.view.Live()
	var stuck []string
	for _, st := range live {
		if st.Phase != assignment.Running && len(stuck) < 5 {
			stuck = append(stuck, fmt.Sprintf("task %d %s since %s", st.Task, st.Phase, st.At.Format(time.TimeOnly)))
		}
	}
	logs := "(none)"
	if b, err := os.ReadFile(p.logPath); err == nil && len(b) > 0 {
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		logs = strings.Join(lines[max(0, len(lines)-20):], "\n")
	}
	return fmt.Sprintf("transitions seen %v, live %d (not running: %v), forge successes %d; last warnings:\n%s",
		seen, len(live), stuck, p.forge.successes.Load(), logs)
}

// apiCounter counts JetStream API requests by kind and stream ("DIRECT.GET KV_dynrunner_tasks", ...).
type apiCounter struct {
	mu    sync.Mutex
	total int
	kinds map[string]int
}

func (a *apiCounter) count(m *nats.Msg) {
	// $JS.API.<KIND>[.<SUBKIND>].<stream>...: keep the upper-case kind tokens and the stream.
	tok := strings.Split(m.Subject, ".")[2:]
	kind := tok[0]
	for _, t := range tok[1:] {
		if strings.HasPrefix(t, "DYNRUNNER_") || strings.HasPrefix(t, "KV_") {
			kind += " " + t // the stream: which reads a lifecycle makes
			break
		}
		if t != strings.ToUpper(t) {
			break
		}
		kind += "." + t
	}
	a.mu.Lock()
	if a.kinds == nil {
		a.kinds = make(map[string]int)
	}
	a.total++
	a.kinds[kind]++
	a.mu.Unlock()
}

func (a *apiCounter) snapshot() (int, map[string]int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.total, maps.Clone(a.kinds)
}

// rttProbe measures what one JetStream read costs the components while the benchmark runs: a
// last-message lookup, as each of them makes several of in sequence per lifecycle, over the
// shared connection, every 20 ms.
type rttProbe struct {
	stop context.CancelFunc
	done chan struct{}
	rtts []time.Duration
}

func (p *plane) probeRTT() *rttProbe {
	ctx, cancel := context.WithCancel(context.Background())
	r := &rttProbe{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			began := time.Now()
			_, _ = p.log.Get(ctx, assignment.TaskID(1<<62)) // a task that never exists
			if ctx.Err() == nil {
				r.rtts = append(r.rtts, time.Since(began))
			}
		}
	}()
	return r
}

// end stops the probe and returns its median round trip and how many lookups it made.
func (r *rttProbe) end() (time.Duration, int) {
	r.stop()
	<-r.done
	if len(r.rtts) == 0 {
		return 0, 0
	}
	return median(r.rtts), len(r.rtts)
}
