package autoscale

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/fleet"
	"github.com/dynrunner/dynrunner/internal/liveness"
)

// Config configures an Actuator.
type Config struct {
	Policy Policy
	Engine Engine
	// Fleet reads the fleet: the workers' heartbeats and the live assignments (the
	// controller's own view holds those, so no round reads them from JetStream again).
	Fleet func(context.Context) (fleet.Report, error)
	// Cordons is the cordons bucket.
	Cordons jetstream.KeyValue
	// PerWorker is one pod worker's capacity (POD_CONCURRENCY), for scaling from zero.
	PerWorker int
	// Held reports whether this scheduler holds the reconcile lease: only its holder acts.
	Held func() bool
	// Actor names this process in the cordons it writes; it begins with ActorPrefix.
	Actor string
	// Interval is the pause between rounds.
	Interval time.Duration
	// StopGrace is how long a drained container gets to exit after SIGTERM.
	StopGrace time.Duration
	Log       zerolog.Logger
	// Registerer, if set, receives the actuator's metrics.
	Registerer prometheus.Registerer
}

// Actuator scales the pod workers on one engine to the autoscaling decision.
type Actuator struct {
	cfg     Config
	mem     Memory
	actions *prometheus.CounterVec
	errs    prometheus.Counter
	target  prometheus.Gauge
}

// New returns an Actuator.
func New(cfg Config) *Actuator {
	a := &Actuator{cfg: cfg,
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dynrunner_autoscale_actions_total",
			Help: "Steps of the built-in actuator (AUTOSCALE=docker): start, cordon, uncordon, remove."}, []string{"action"}),
		errs: prometheus.NewCounter(prometheus.CounterOpts{Name: "dynrunner_autoscale_errors_total",
			Help: "Rounds of the built-in actuator that failed (the fleet, the engine or a step); it tries again next round."}),
		target: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dynrunner_autoscale_target_workers",
			Help: "Active pod workers the built-in actuator aims for: desired_workers within AUTOSCALE_MIN and AUTOSCALE_MAX."}),
	}
	if cfg.Registerer != nil {
		cfg.Registerer.MustRegister(a.actions, a.errs, a.target)
	}
	return a
}

// Run acts every Interval while this scheduler holds the reconcile lease, until ctx ends.
func (a *Actuator) Run(ctx context.Context) {
	for clock.Sleep(ctx, a.cfg.Interval) == nil {
		if !a.cfg.Held() {
			a.mem = Memory{} // another replica acts; start afresh when the lease comes back
			continue
		}
		if _, err := a.Round(ctx, time.Now()); err != nil && ctx.Err() == nil {
			a.errs.Inc()
			a.cfg.Log.Warn().Err(err).Msg("autoscale round")
		}
	}
}

// Round reads the fleet, the containers and the cordons, plans, and carries the plan out; it
// returns the steps planned.
func (a *Actuator) Round(ctx context.Context, now time.Time) (Steps, error) {
	r, err := a.cfg.Fleet(ctx)
	if err != nil {
		return Steps{}, fmt.Errorf("read the fleet: %w", err)
	}
	scale := r.Decisions(map[assignment.Backend]int{assignment.BackendPod: a.cfg.PerWorker})[assignment.BackendPod]
	containers, err := a.cfg.Engine.List(ctx)
	if err != nil {
		return Steps{}, err
	}
	cordoned, err := a.cordoned(ctx)
	if err != nil {
		return Steps{}, err
	}
	members := Members(containers, r.Components, cordoned)
	s := Plan(scale.DesiredWorkers, members, a.cfg.Policy, &a.mem, now)
	a.target.Set(float64(s.Target))
	if s.Empty() {
		return s, nil
	}
	log := a.cfg.Log.Info().Int("desired", scale.DesiredWorkers).Str("decision", scale.Reason).Int("target", s.Target).Str("plan", s.Reason)
	log.Int("start", s.Start).Strs("cordon", s.Cordon).Strs("uncordon", s.Uncordon).Int("remove", len(s.Remove)).Msg("autoscale")
	var errs []error
	for _, w := range s.Cordon {
		if err := liveness.PutCordon(ctx, a.cfg.Cordons, w, liveness.Cordon{By: a.cfg.Actor, At: now.UTC()}); err != nil {
			errs = append(errs, err)
			continue
		}
		a.actions.WithLabelValues("cordon").Inc()
	}
	for _, w := range s.Uncordon {
		if err := liveness.DeleteCordon(ctx, a.cfg.Cordons, w); err != nil {
			errs = append(errs, err)
			continue
		}
		a.actions.WithLabelValues("uncordon").Inc()
	}
	for _, m := range s.Remove {
		if err := a.cfg.Engine.Remove(ctx, m.Name, a.cfg.StopGrace); err != nil {
			errs = append(errs, err)
			continue
		}
		a.cfg.Log.Info().Str("container", m.Name).Str("worker", m.Worker).Bool("exited", !m.Running).Msg("autoscale: removed a pod worker")
		a.actions.WithLabelValues("remove").Inc()
		if m.Worker != "" {
			if err := liveness.DeleteCordon(ctx, a.cfg.Cordons, m.Worker); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for range s.Start {
		name, err := a.cfg.Engine.Start(ctx)
		if err != nil {
			errs = append(errs, err)
			break
		}
		a.cfg.Log.Info().Str("container", name).Msg("autoscale: started a pod worker")
		a.actions.WithLabelValues("start").Inc()
	}
	return s, errors.Join(errs...)
}

// cordoned returns the cordons by worker key. One that cannot be read counts as an
// operator's: the actuator neither lifts it nor removes its worker.
func (a *Actuator) cordoned(ctx context.Context) (map[string]liveness.Cordon, error) {
	keys, err := a.cfg.Cordons.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the cordons: %w", err)
	}
	out := map[string]liveness.Cordon{}
	for k := range keys.Keys() {
		c, err := liveness.GetCordon(ctx, a.cfg.Cordons, k)
		if errors.Is(err, liveness.ErrNoCordon) {
			continue
		}
		if err != nil {
			c = liveness.Cordon{By: "unreadable"}
		}
		out[k] = c
	}
	return out, nil
}

// ActorPrefix begins the By of every cordon the actuator writes (Config.Actor): the cordons
// it may lift and whose workers it may remove.
const ActorPrefix = "autoscale@"

// Members joins the containers with their workers' heartbeats (by host name; the newest
// heartbeat when the engine restarted a worker inside its container) and cordons.
func Members(containers []Container, components []liveness.Record, cordoned map[string]liveness.Cordon) []Member {
	byHost := map[string]liveness.Record{}
	for _, r := range components {
		if r.Kind != liveness.KindPodWorker || r.Worker == nil {
			continue
		}
		if old, ok := byHost[r.Host]; !ok || r.StartedAt.After(old.StartedAt) {
			byHost[r.Host] = r
		}
	}
	out := make([]Member, 0, len(containers))
	for _, c := range containers {
		m := Member{Name: c.Name, Host: c.Host, Running: c.Running, Created: c.Created}
		if r, ok := byHost[c.Host]; ok && c.Host != "" {
			m.Worker, m.InFlight, m.Draining, m.Beat = r.Key(), r.Worker.InFlight, r.Worker.Draining, r.LastBeat
			if c, ok := cordoned[m.Worker]; ok {
				m.Cordoned, m.CordonedAt, m.Ours = true, c.At, strings.HasPrefix(c.By, ActorPrefix)
			}
		}
		out = append(out, m)
	}
	return out
}
