package main

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/autoscale"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// workerCapacity follows the capacity the workers online announce (ADMIT_CAPACITY=workers):
// per tier, the slots of the workers taking work. It reads
// the heartbeats every interval; a reading older than stale does not count (the scheduler then
// admits nothing until the heartbeats read again).
type workerCapacity struct {
	mu    sync.Mutex
	last  map[assignment.Backend]int
	at    time.Time
	stale time.Duration
}

// capacityOfWorkers returns the tiers' capacity from the heartbeats in components: the
// slots of the workers that take work. A draining worker adds none: what it still holds counts
// against the others' slots until it ends, so admission errs on the side of too few. (Its
// heartbeat's in-flight count lags the jobs that end on it, and counting that would admit
// claims no worker takes before their pickup deadline.)
func capacityOfWorkers(components []liveness.Record) map[assignment.Backend]int {
	out := map[assignment.Backend]int{assignment.BackendPod: 0, assignment.BackendVM: 0}
	for _, r := range components {
		if r.Worker == nil {
			continue
		}
		tier := assignment.BackendPod
		if r.Kind == liveness.KindVMWorker {
			tier = assignment.BackendVM
		}
		if !r.Worker.Draining {
			out[tier] += r.Worker.Capacity
		}
	}
	return out
}

func (w *workerCapacity) follow(ctx context.Context, js jetstream.JetStream, every time.Duration) {
	for {
		records, _, err := fleet.ReadComponents(ctx, js)
		if err == nil {
			w.mu.Lock()
			w.last, w.at = capacityOfWorkers(records), time.Now()
			w.mu.Unlock()
		}
		if clock.Sleep(ctx, every) != nil {
			return
		}
	}
}

// get is scheduler.Config.CapacityOf.
func (w *workerCapacity) get() (map[assignment.Backend]int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last == nil || time.Since(w.at) > w.stale {
		return nil, false
	}
	return w.last, true
}

// startActuator starts the built-in actuator (AUTOSCALE=docker) beside the scheduler: the
// template is checked at boot (a missing or unfit one refuses the boot), and only the
// scheduler holding the reconcile lease acts.
func (p *plane) startActuator(ctx context.Context, held func() bool) error {
	cfg := p.cfg.Autoscale
	engine, err := autoscale.NewDocker(ctx, cfg.Socket, cfg.Template)
	if err != nil {
		return err
	}
	p.onExit(func() { _ = engine.Close() })
	perWorker := p.cfg.PodConcurrency
	if n := engine.PerWorker(); n > 0 {
		perWorker = n // the template's own POD_CONCURRENCY
	}
	a := autoscale.New(autoscale.Config{
		Policy: autoscale.Policy{Min: cfg.Min, Max: cfg.Max, Cooldown: cfg.Cooldown, Boot: autoscale.DefaultBoot},
		Engine: engine, Fleet: p.fleet, Cordons: p.evlog.Cordons(), PerWorker: perWorker,
		Held: held, Actor: autoscale.ActorPrefix + p.actor, Interval: time.Second, StopGrace: 10 * time.Second,
		Log: p.log.With().Str("component", "autoscale").Logger(), Registerer: p.reg,
	})
	p.g.Go(func() error { a.Run(p.gctx); return nil })
	p.log.Info().Str("template", cfg.Template).Int("min", cfg.Min).Int("max", cfg.Max).Dur("cooldown", cfg.Cooldown).Msg("autoscale: pod workers on the Docker engine")
	return nil
}
