package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
	"github.com/dynrunner/dynrunner/podworker"
)

// cordonPoll is how often a worker reads its cordon.
const cordonPoll = time.Second

// drainWorker is one pod or vm worker of this process, by its heartbeat key (the worker id of
// `dynrunner drain`).
type drainWorker struct {
	key string
	w   *podworker.Worker
}

// followCordon keeps w draining while its cordon exists in eventlog.BucketCordons, or while
// the process stops with DRAIN_SECS. A read that fails keeps the state it had.
func (p *plane) followCordon(kind string, w *podworker.Worker) {
	key := kind + "." + liveness.Instance(p.actor)
	p.workersMu.Lock()
	p.workers = append(p.workers, drainWorker{key: key, w: w})
	p.workersMu.Unlock()
	logger := p.log.With().Str("component", kind).Str("worker", key).Logger()
	p.g.Go(func() error {
		for {
			_, err := liveness.GetCordon(p.gctx, p.evlog.Cordons(), key)
			switch {
			case err == nil:
				w.SetDraining(true)
			case errors.Is(err, liveness.ErrNoCordon):
				w.SetDraining(p.stopping.Load())
			case p.gctx.Err() == nil:
				logger.Warn().Err(err).Msg("read the worker's cordon; keeping its drain state")
			}
			if clock.Sleep(p.gctx, cordonPoll) != nil {
				return nil //nolint:nilerr // the controller stops: no failure
			}
		}
	})
}

// drainOnStop waits for stop (SIGTERM), then drains this process's workers: they take nothing
// new and finish what they hold, for at most DRAIN_SECS; then it ends the controller through
// cancel. Environments still running then are adopted by another worker, or by this one's
// restart, as without a drain.
func (p *plane) drainOnStop(stop context.Context, run context.Context, cancel context.CancelFunc) {
	select {
	case <-stop.Done():
	case <-run.Done():
		return
	}
	p.stopping.Store(true)
	for _, dw := range p.drainWorkers() {
		dw.w.SetDraining(true)
	}
	deadline := time.Now().Add(p.cfg.DrainTimeout)
	p.log.Info().Dur("drain_secs", p.cfg.DrainTimeout).Int("in_flight", p.inFlight()).Msg("stopping: draining the workers first")
	for p.inFlight() > 0 && time.Now().Before(deadline) {
		if clock.Sleep(run, 200*time.Millisecond) != nil {
			return
		}
	}
	if n := p.inFlight(); n > 0 {
		p.log.Warn().Int("in_flight", n).Msg("DRAIN_SECS passed with environments running: stopping anyway; another worker (or this one's restart) adopts them")
	} else {
		p.log.Info().Msg("drained: no environment left")
	}
	cancel()
}

// drainWorkers returns this process's workers started so far.
func (p *plane) drainWorkers() []drainWorker {
	p.workersMu.Lock()
	defer p.workersMu.Unlock()
	return slices.Clone(p.workers)
}

func (p *plane) inFlight() int {
	n := 0
	for _, dw := range p.drainWorkers() {
		n += dw.w.InFlight()
	}
	return n
}

// workerStatus is what GET /v1/workers/{id} answers: one worker's drain state.
type workerStatus struct {
	ID       string `json:"id"`
	Kind     string `json:"kind"`
	Host     string `json:"host"`
	Capacity int    `json:"capacity"`
	InFlight int    `json:"in_flight"`
	// Cordoned: a cordon exists; Draining: the worker's last heartbeat says it drains.
	Cordoned bool `json:"cordoned"`
	Draining bool `json:"draining"`
	// SafeToRemove: cordoned, and its last heartbeat drains with nothing in flight.
	SafeToRemove bool      `json:"safe_to_remove"`
	LastBeat     time.Time `json:"last_beat"`
	Error        string    `json:"error,omitempty"`
}

// errNoWorker: no worker alive has the id.
var errNoWorker = errors.New("no worker alive has this id")

// workerOf finds the worker id names among the heartbeats: its heartbeat key
// (<kind>.<instance>), or an instance that only one worker has.
func workerOf(ctx context.Context, js jetstream.JetStream, id string) (liveness.Record, error) {
	records, _, err := fleet.ReadComponents(ctx, js)
	if err != nil {
		return liveness.Record{}, err
	}
	var found []liveness.Record
	for _, r := range records {
		if r.Worker != nil && (r.Key() == id || r.Instance == id) {
			found = append(found, r)
		}
	}
	switch len(found) {
	case 0:
		return liveness.Record{}, fmt.Errorf("worker %q: %w (the ids are the KIND.INSTANCE of `dynrunner status`)", id, errNoWorker)
	case 1:
		return found[0], nil
	}
	return liveness.Record{}, fmt.Errorf("worker %q: several workers of this process; name one as pod-worker.%s or vm-worker.%s", id, id, id)
}

// statusOf is the drain state of worker r.
func statusOf(ctx context.Context, cordons jetstream.KeyValue, r liveness.Record) (workerStatus, error) {
	_, err := liveness.GetCordon(ctx, cordons, r.Key())
	if err != nil && !errors.Is(err, liveness.ErrNoCordon) {
		return workerStatus{}, err
	}
	cordoned := err == nil
	return workerStatus{ID: r.Key(), Kind: r.Kind, Host: r.Host, Capacity: r.Worker.Capacity, InFlight: r.Worker.InFlight,
		Cordoned: cordoned, Draining: r.Worker.Draining, SafeToRemove: cordoned && r.Worker.SafeToRemove(), LastBeat: r.LastBeat}, nil
}

// workersHandler serves GET /v1/workers/{id}, and POST and DELETE /v1/workers/{id}/drain: the
// drain state of a worker, and its cordon put or lifted (by the scheduler's NATS user on a
// split deployment).
func (p *plane) workersHandler(mux *http.ServeMux) {
	answer := func(rw http.ResponseWriter, code int, s workerStatus) {
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(code)
		_ = json.NewEncoder(rw).Encode(s)
	}
	fail := func(rw http.ResponseWriter, id string, err error) {
		code := http.StatusServiceUnavailable
		if errors.Is(err, errNoWorker) {
			code = http.StatusNotFound
		} else if strings.Contains(err.Error(), "several workers") {
			code = http.StatusConflict
		}
		answer(rw, code, workerStatus{ID: id, Error: err.Error()})
	}
	serve := func(change func(ctx context.Context, r liveness.Record) error) http.HandlerFunc {
		return func(rw http.ResponseWriter, req *http.Request) {
			ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
			defer cancel()
			id := req.PathValue("id")
			r, err := workerOf(ctx, p.js, id)
			if err == nil && change != nil {
				err = change(ctx, r)
			}
			var s workerStatus
			if err == nil {
				s, err = statusOf(ctx, p.evlog.Cordons(), r)
			}
			if err != nil {
				fail(rw, id, err)
				return
			}
			answer(rw, http.StatusOK, s)
		}
	}
	mux.Handle("GET /v1/workers/{id}", serve(nil))
	mux.Handle("POST /v1/workers/{id}/drain", serve(func(ctx context.Context, r liveness.Record) error {
		err := liveness.PutCordon(ctx, p.evlog.Cordons(), r.Key(), liveness.Cordon{By: p.actor, At: time.Now().UTC()})
		if err == nil {
			p.log.Info().Str("worker", r.Key()).Msg("worker cordoned: it drains")
		}
		return err
	}))
	mux.Handle("DELETE /v1/workers/{id}/drain", serve(func(ctx context.Context, r liveness.Record) error {
		err := liveness.DeleteCordon(ctx, p.evlog.Cordons(), r.Key())
		if err == nil {
			p.log.Info().Str("worker", r.Key()).Msg("worker's cordon lifted")
		}
		return err
	}))
}

// runDrain is `dynrunner drain [--undo] [--wait D] WORKER`: it cordons the worker through the
// controller whose HTTP_LISTEN getenv names, and prints its drain state; with --wait it waits up
// to D for it to be safe to remove, and fails if it is not.
func runDrain(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	undo := fs.Bool("undo", false, "lift the cordon: the worker takes new environments again")
	wait := fs.Duration("wait", 0, "wait up to this long until the worker is safe to remove (0: do not wait)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: dynrunner drain [--undo] [--wait DURATION] WORKER (the KIND.INSTANCE `dynrunner status` lists)")
	}
	workers, err := drainSettings(getenv)
	if err != nil {
		return err
	}
	base := workers + url.PathEscape(fs.Arg(0))
	method := http.MethodPost
	if *undo {
		method = http.MethodDelete
	}
	s, err := workerCall(ctx, method, base+"/drain")
	if err != nil {
		return err
	}
	deadline := time.Now().Add(*wait)
	for !*undo && *wait > 0 && !s.SafeToRemove && time.Now().Before(deadline) {
		if err := clock.Sleep(ctx, time.Second); err != nil {
			return err
		}
		if s, err = workerCall(ctx, http.MethodGet, base); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "%s on %s: cordoned %t, draining %t, %d of %d in flight, safe_to_remove %t\n",
		s.ID, s.Host, s.Cordoned, s.Draining, s.InFlight, s.Capacity, s.SafeToRemove)
	if *wait > 0 && !*undo && !s.SafeToRemove {
		return fmt.Errorf("%s is not safe to remove after %s: %d environments in flight", s.ID, *wait, s.InFlight)
	}
	return nil
}

// drainSettings reads the configuration of `dynrunner drain` from getenv, before any request:
// the workers' API (/v1/workers/, ending in a slash) of the controller whose HTTP_LISTEN getenv
// names.
func drainSettings(getenv func(string) string) (string, error) {
	status, err := statusURL(getenv)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(status, "/status") + "/v1/workers/", nil
}

func workerCall(ctx context.Context, method, u string) (workerStatus, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, u, nil)
	if err != nil {
		return workerStatus{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return workerStatus{}, fmt.Errorf("no controller answers at %s (is one running, with this HTTP_LISTEN?): %w", u, err)
	}
	defer resp.Body.Close()
	var s workerStatus
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&s); err != nil {
		return workerStatus{}, fmt.Errorf("%s %s: %s", method, u, resp.Status)
	}
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, s.Error)
	}
	return s, nil
}

// sweepCordons removes the cordons of workers that are gone: a cordon names one worker process
// (its heartbeat key holds its pid and a random part), so once that process has no heartbeat
// its cordon can never apply again. Only the scheduler holding the reconcile lease sweeps, every
// LIVENESS_TTL; a cordon goes only when its worker's heartbeat was missing at two sweeps in a
// row, so a heartbeat that lapsed for a moment on a loaded host does not lift a drain.
func (p *plane) sweepCordons(held func() bool) {
	missing := map[string]bool{}
	for clock.Sleep(p.gctx, p.cfg.LivenessTTL) == nil {
		if !held() {
			clear(missing)
			continue
		}
		n, err := sweepCordonsOnce(p.gctx, p.js, p.evlog.Cordons(), missing)
		if err != nil && p.gctx.Err() == nil {
			p.log.Warn().Err(err).Msg("sweep the cordons of workers that are gone")
		} else if n > 0 {
			p.log.Info().Int("removed", n).Msg("removed the cordons of workers that are gone")
		}
	}
}

// sweepCordonsOnce deletes the cordons whose worker had no heartbeat now and at the previous
// sweep (missing, updated here), and returns how many it deleted.
func sweepCordonsOnce(ctx context.Context, js jetstream.JetStream, cordons jetstream.KeyValue, missing map[string]bool) (int, error) {
	keys, err := cordons.ListKeys(ctx)
	if err != nil {
		return 0, err
	}
	var cordoned []string
	for k := range keys.Keys() {
		cordoned = append(cordoned, k)
	}
	if len(cordoned) == 0 {
		clear(missing)
		return 0, nil
	}
	records, _, err := fleet.ReadComponents(ctx, js)
	if err != nil {
		return 0, err
	}
	alive := map[string]bool{}
	for _, r := range records {
		alive[r.Key()] = true
	}
	n := 0
	now := map[string]bool{}
	for _, k := range cordoned {
		if alive[k] {
			continue
		}
		if missing[k] {
			if err := liveness.DeleteCordon(ctx, cordons, k); err != nil {
				return n, err
			}
			n++
			continue
		}
		now[k] = true
	}
	clear(missing)
	maps.Copy(missing, now)
	return n, nil
}
