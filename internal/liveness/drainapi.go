package liveness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// WorkerStatus is what GET /v1/workers/{id} answers: one worker's drain state.
type WorkerStatus struct {
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

var (
	// ErrNoWorker (FindWorker): no worker alive has the id.
	ErrNoWorker = errors.New("no worker alive has this id")
	// ErrSeveralWorkers (FindWorker): the id is an instance that several workers share (the
	// pod and the vm worker of one process).
	ErrSeveralWorkers = errors.New("several workers of this process")
)

// FindWorker finds the worker id names among the heartbeats: its heartbeat key
// (<kind>.<instance>), or an instance that only one worker has. It returns an error wrapping
// ErrNoWorker or ErrSeveralWorkers when it finds none or several.
func FindWorker(records []Record, id string) (Record, error) {
	var found []Record
	for _, r := range records {
		if r.Worker != nil && (r.Key() == id || r.Instance == id) {
			found = append(found, r)
		}
	}
	switch len(found) {
	case 0:
		return Record{}, fmt.Errorf("worker %q: %w (the ids are the KIND.INSTANCE of `dynrunner status`)", id, ErrNoWorker)
	case 1:
		return found[0], nil
	}
	return Record{}, fmt.Errorf("worker %q: %w; name one as pod-worker.%s or vm-worker.%s", id, ErrSeveralWorkers, id, id)
}

// StatusOf is the drain state of worker r, whose cordon, if any, is cordon (nil: none).
func StatusOf(r Record, cordon *Cordon) WorkerStatus {
	cordoned := cordon != nil
	return WorkerStatus{ID: r.Key(), Kind: r.Kind, Host: r.Host, Capacity: r.Worker.Capacity, InFlight: r.Worker.InFlight,
		Cordoned: cordoned, Draining: r.Worker.Draining, SafeToRemove: cordoned && r.Worker.SafeToRemove(), LastBeat: r.LastBeat}
}

// DrainAPI configures the workers' drain API (DrainHandler).
type DrainAPI struct {
	// Cordons is the cordons bucket (eventlog.BucketCordons).
	Cordons jetstream.KeyValue
	// Components reads the heartbeats alive (fleet.ReadComponents).
	Components func(context.Context) ([]Record, error)
	// Actor is who puts the cordons (Cordon.By).
	Actor string
	// Log receives the cordons put and lifted.
	Log zerolog.Logger
}

// DrainHandler serves GET /v1/workers/{id}, and POST and DELETE /v1/workers/{id}/drain: the
// drain state of a worker (WorkerStatus), and its cordon put or lifted (by the scheduler's NATS
// user on a split deployment). A worker no heartbeat names is a 404, an id several workers
// share a 409, and a failure to read or write JetStream a 503. Mount it at /v1/workers/.
func DrainHandler(a DrainAPI) http.Handler {
	answer := func(rw http.ResponseWriter, code int, s WorkerStatus) {
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(code)
		_ = json.NewEncoder(rw).Encode(s)
	}
	fail := func(rw http.ResponseWriter, id string, err error) {
		code := http.StatusServiceUnavailable
		if errors.Is(err, ErrNoWorker) {
			code = http.StatusNotFound
		} else if errors.Is(err, ErrSeveralWorkers) {
			code = http.StatusConflict
		}
		answer(rw, code, WorkerStatus{ID: id, Error: err.Error()})
	}
	serve := func(change func(ctx context.Context, r Record) error) http.HandlerFunc {
		return func(rw http.ResponseWriter, req *http.Request) {
			ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
			defer cancel()
			id := req.PathValue("id")
			s, err := a.status(ctx, id, change)
			if err != nil {
				fail(rw, id, err)
				return
			}
			answer(rw, http.StatusOK, s)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /v1/workers/{id}", serve(nil))
	mux.Handle("POST /v1/workers/{id}/drain", serve(func(ctx context.Context, r Record) error {
		err := PutCordon(ctx, a.Cordons, r.Key(), Cordon{By: a.Actor, At: time.Now().UTC()})
		if err == nil {
			a.Log.Info().Str("worker", r.Key()).Msg("worker cordoned: it drains")
		}
		return err
	}))
	mux.Handle("DELETE /v1/workers/{id}/drain", serve(func(ctx context.Context, r Record) error {
		err := DeleteCordon(ctx, a.Cordons, r.Key())
		if err == nil {
			a.Log.Info().Str("worker", r.Key()).Msg("worker's cordon lifted")
		}
		return err
	}))
	return mux
}

// status finds the worker id names, applies change to it (when not nil), and reads its
// drain state.
func (a DrainAPI) status(ctx context.Context, id string, change func(context.Context, Record) error) (WorkerStatus, error) {
	records, err := a.Components(ctx)
	if err != nil {
		return WorkerStatus{}, err
	}
	r, err := FindWorker(records, id)
	if err != nil {
		return WorkerStatus{}, err
	}
	if change != nil {
		if err := change(ctx, r); err != nil {
			return WorkerStatus{}, err
		}
	}
	c, err := GetCordon(ctx, a.Cordons, r.Key())
	switch {
	case errors.Is(err, ErrNoCordon):
		return StatusOf(r, nil), nil
	case err != nil:
		return WorkerStatus{}, err
	}
	return StatusOf(r, &c), nil
}
