package main

import (
	"context"
	"time"

	"github.com/dynrunner/dynrunner/autoscale"
)

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
