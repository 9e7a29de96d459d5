package identity

import (
	"context"
	"fmt"
	"time"

	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"

	"github.com/dynrunner/dynrunner/internal/clock"
	"github.com/dynrunner/dynrunner/internal/workload"
	"github.com/dynrunner/dynrunner/podworker/docker"
)

// containerEntryIDPrefix begins the ID of a container's entry; the rest is the container id.
const containerEntryIDPrefix = "dynrunner-ctr-"

// Containers lists the docker pod backend's running containers of one scope and reports
// their changes; *docker.Inventory implements it.
type Containers interface {
	Scope() string
	Running(ctx context.Context) ([]docker.Running, error)
	// Watch calls changed on every start or end of a container of the scope until ctx ends
	// (nil) or the event stream breaks (an error).
	Watch(ctx context.Context, changed func()) error
}

var _ Containers = (*docker.Inventory)(nil)

// containerEntries returns the entries the running containers want, by ID: one per
// container, selected by the scope, task and epoch labels the docker workload attestor
// reports (docker:label:<key>:<value>).
func (r *Registrar) containerEntries(ctx context.Context) (map[string]*types.Entry, error) {
	cs, err := r.cfg.Docker.Running(ctx)
	if err != nil {
		return nil, fmt.Errorf("identity: list job containers: %w", err)
	}
	scope := r.cfg.Docker.Scope()
	want := make(map[string]*types.Entry, len(cs)+2)
	for _, c := range cs {
		id := workload.AssignmentID(r.cfg.TrustDomain, c.Task, c.Epoch)
		if id.IsZero() || c.ContainerID == "" {
			continue
		}
		e := r.workloadEntry(containerEntryIDPrefix+c.ContainerID, id, r.cfg.ParentID, []*types.Selector{
			{Type: "docker", Value: "label:" + docker.LabelScope + ":" + scope},
			{Type: "docker", Value: "label:" + docker.LabelTask + ":" + c.Task.String()},
			{Type: "docker", Value: "label:" + docker.LabelEpoch + ":" + c.Epoch.String()},
		})
		want[e.Id] = e
	}
	return want, nil
}

// watchContainers triggers a reconciliation on every container event until ctx ends,
// reconnecting to the engine's event stream after a pause when it breaks (the periodic
// resync covers the gap).
func (r *Registrar) watchContainers(ctx context.Context) {
	pause := time.Second
	for {
		err := r.cfg.Docker.Watch(ctx, r.trigger)
		if ctx.Err() != nil {
			return
		}
		r.cfg.Log.Warn().Err(err).Dur("retry_in", pause).Msg("docker events")
		r.trigger() // events may have been missed
		if clock.Sleep(ctx, pause) != nil {
			return
		}
		pause = min(2*pause, r.cfg.Resync)
	}
}
