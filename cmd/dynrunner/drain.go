package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

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

// followCordon registers w, a worker of this process, for drains: it drains while its cordon
// exists or the process stops with DRAIN_SECS.
func (p *plane) followCordon(kind string, w *podworker.Worker) {
	key := kind + "." + liveness.Instance(p.actor)
	p.workersMu.Lock()
	p.workers = append(p.workers, drainWorker{key: key, w: w})
	p.workersMu.Unlock()
	p.g.Go(func() error { return w.FollowCordon(p.gctx, p.evlog.Cordons(), key, cordonPoll, p.stopping.Load) })
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

// drainAPI is the workers' drain API this controller serves at /v1/workers/.
func (p *plane) drainAPI() http.Handler {
	return liveness.DrainHandler(liveness.DrainAPI{
		Cordons: p.evlog.Cordons(), Components: p.readComponents, Actor: p.actor, Log: p.log,
	})
}

// readComponents reads the heartbeats alive.
func (p *plane) readComponents(ctx context.Context) ([]liveness.Record, error) {
	records, _, err := fleet.ReadComponents(ctx, p.js)
	return records, err
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

func workerCall(ctx context.Context, method, u string) (liveness.WorkerStatus, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, u, nil)
	if err != nil {
		return liveness.WorkerStatus{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return liveness.WorkerStatus{}, fmt.Errorf("no controller answers at %s (is one running, with this HTTP_LISTEN?): %w", u, err)
	}
	defer resp.Body.Close()
	var s liveness.WorkerStatus
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&s); err != nil {
		return liveness.WorkerStatus{}, fmt.Errorf("%s %s: %s", method, u, resp.Status)
	}
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("%s %s: %s: %s", method, u, resp.Status, s.Error)
	}
	return s, nil
}

// sweepCordons removes the cordons of workers that are gone, every LIVENESS_TTL while held
// (the reconcile lease) reports true.
func (p *plane) sweepCordons(held func() bool) error {
	s := &liveness.CordonSweeper{Cordons: p.evlog.Cordons(), Components: p.readComponents, Held: held,
		Every: p.cfg.LivenessTTL, Log: p.log}
	return s.Run(p.gctx)
}
