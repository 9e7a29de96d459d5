package autoscale

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	autoscalepkg "github.com/dynrunner/dynrunner/autoscale"
	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/testbed/fleetbed"
)

// loadWorkflow has two long jobs first and six short ones: the short ones end while the long
// ones run, so the actuator drains surplus workers while some of them still hold work.
const loadWorkflow = `name: load
on: [push]
jobs:
  long1: &long
    runs-on: [self-hosted, pod]
    steps:
      - run: for i in $(seq 1 40); do echo "long line $i"; sleep 1; done
  long2: *long
  short1: &short
    runs-on: [self-hosted, pod]
    steps:
      - run: for i in $(seq 1 8); do echo "short line $i"; sleep 1; done
  short2: *short
  short3: *short
  short4: *short
  short5: *short
  short6: *short
`

// TestActuatorScalesThroughDrain runs a scheduler with AUTOSCALE=docker (AUTOSCALE_MAX=3,
// two slots per worker, no pod worker at the start) and a facade on a split deployment, and
// pushes eight jobs to the real Gitea. The actuator must start pod-worker containers up to
// the maximum while jobs queue, every job must end green, and once the work is done it must
// scale to zero through drain: every container it removed had ended all the jobs its worker
// took before it was removed.
func TestActuatorScalesThroughDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a multi-host deployment")
	}
	tools := fleetbed.Need(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()

	image, err := fleetbed.ExecutorImage(ctx, filepath.Join("..", ".."))
	require.NoError(t, err)
	bed, err := fleetbed.Start(ctx, fleetbed.Options{
		Dir: t.TempDir(), Tools: tools, ExecutorImage: image,
		Schedulers: 1, Facades: 1, PodWorkers: -1, PodConcurrency: 2,
		Env: []string{"LEASE_SECS=90", "PICKUP_SECS=60", "KEEPALIVE_SECS=5"},
		SchedulerEnv: []string{"MAX_QUEUED=20", "ADMIT_CAPACITY=workers", "POD_CONCURRENCY=2",
			"AUTOSCALE=docker", "AUTOSCALE_MAX=3", "AUTOSCALE_COOLDOWN=15s"},
		SchedulerDocker: true, PodWorkerTemplate: []string{"DRAIN_SECS=120"},
		Output: fleetbed.TestOutput{T: t},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range bed.Dynrunner {
				t.Logf("%s:\n%s", c.Name, fleetbed.Tail(c.Logs(context.Background()), 80))
			}
		}
		assert.NoError(t, bed.Close(), "remove the bed")
	})
	rec := watchRecords(ctx, t, bed)
	watch := watchContainers(ctx, t, bed.Template)

	repo, err := bed.Forge.CreateRepo(ctx, "autoscale")
	require.NoError(t, err)
	sha, err := bed.Forge.PushFiles(ctx, repo, map[string]string{".gitea/workflows/load.yml": loadWorkflow})
	require.NoError(t, err)

	// Up under load: the queue holds 8 jobs for 0 slots, so the actuator wants 4 workers and
	// starts AUTOSCALE_MAX=3.
	require.Eventually(t, func() bool { return watch.most() == 3 }, 5*time.Minute, 500*time.Millisecond,
		"pod-worker containers running at most: %d", watch.most())

	wctx, wcancel := context.WithTimeout(ctx, 10*time.Minute)
	run, err := bed.Forge.WaitRun(wctx, repo, sha)
	wcancel()
	require.NoError(t, err)
	require.Len(t, run.Jobs, 8)
	for _, j := range run.Jobs {
		if !assert.Equal(t, devforge.ConclusionSuccess, j.Conclusion, "job %s", j.Name) {
			log, _ := bed.Forge.JobLog(ctx, repo, j.ID)
			t.Logf("log of %s:\n%s", j.Name, fleetbed.Tail(log, 30))
		}
	}

	// Down through drain, to zero.
	require.Eventually(t, func() bool { return watch.running() == 0 && len(watch.removedAt()) >= 3 }, 5*time.Minute, 500*time.Millisecond,
		"pod-worker containers still running: %d, removed: %v", watch.running(), watch.removedAt())
	require.Eventually(t, func() bool { return rec.ended() == 8 }, time.Minute, 500*time.Millisecond, "assignments ended: %d", rec.ended())

	// Never one removed with work: every job a removed worker took ended before its removal.
	removed := watch.removedAt()
	jobsOn := rec.jobsByHost()
	drainedWithWork := 0
	for host, gone := range removed {
		for _, j := range jobsOn[host] {
			require.False(t, j.ended.IsZero(), "job %s on %s never ended", j.task, host)
			assert.True(t, j.ended.Before(gone), "%s removed at %s while its job %s ran until %s", host, gone.Format(time.TimeOnly), j.task, j.ended.Format(time.TimeOnly))
		}
		if rec.heldWhenCordoned(host) > 0 {
			drainedWithWork++
		}
	}
	assert.Equal(t, 3, watch.started(), "containers started")
	t.Logf("autoscale: at most %d pod workers; %d removed through drain, %d of them cordoned while they held work; per-host jobs %v",
		watch.most(), len(removed), drainedWithWork, summary(jobsOn))
}

// containers follows the actuator's containers with `docker ps`, every 500 ms.
type containers struct {
	mu     sync.Mutex
	up     map[string]bool      // host name -> running now
	gone   map[string]time.Time // host name -> first seen gone
	max    int
	seen   map[string]bool
	starts int
}

func watchContainers(ctx context.Context, t *testing.T, template string) *containers {
	c := &containers{up: map[string]bool{}, gone: map[string]time.Time{}, seen: map[string]bool{}}
	go func() {
		for ctx.Err() == nil {
			out, err := exec.CommandContext(ctx, "docker", "ps", "-a", "--filter", "label="+autoscalepkg.LabelGroup+"="+template,
				"--format", `{{.Label "`+autoscalepkg.LabelHost+`"}} {{.State}}`).Output()
			if err != nil {
				if ctx.Err() == nil {
					t.Logf("docker ps: %v", err)
				}
				time.Sleep(time.Second)
				continue
			}
			now := time.Now()
			c.mu.Lock()
			present := map[string]bool{}
			for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				host, state, ok := strings.Cut(line, " ")
				if !ok {
					continue
				}
				present[host] = true
				if !c.seen[host] {
					c.seen[host] = true
					c.starts++
				}
				c.up[host] = state == "running"
			}
			for host := range c.seen {
				if !present[host] {
					if _, ok := c.gone[host]; !ok {
						c.gone[host] = now
					}
					delete(c.up, host)
				}
			}
			n := 0
			for _, r := range c.up {
				if r {
					n++
				}
			}
			c.max = max(c.max, n)
			c.mu.Unlock()
			time.Sleep(500 * time.Millisecond) // the poll's pace
		}
	}()
	return c
}

func (c *containers) most() int { c.mu.Lock(); defer c.mu.Unlock(); return c.max }

func (c *containers) started() int { c.mu.Lock(); defer c.mu.Unlock(); return c.starts }

func (c *containers) running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.up {
		if r {
			n++
		}
	}
	return n
}

func (c *containers) removedAt() map[string]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]time.Time{}
	for h, at := range c.gone {
		out[h] = at
	}
	return out
}

// job is one assignment a worker took.
type job struct {
	task  string
	ended time.Time
}

// records follows the assignment records: which worker host took each assignment
// (dispatched) and when it ended (completed or failed); and the cordons: how many
// assignments a worker's host held, not ended, when it was first cordoned.
type records struct {
	mu   sync.Mutex
	host map[string]string
	ends map[string]time.Time
	held map[string]int
}

func watchRecords(ctx context.Context, t *testing.T, bed *fleetbed.Bed) *records {
	url, err := bed.NATSHostURL(ctx)
	require.NoError(t, err)
	user, pass := bed.NATSCredentials()
	nc, err := nats.Connect(url, nats.UserInfo(user, pass), nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	r := &records{host: map[string]string{}, ends: map[string]time.Time{}, held: map[string]int{}}
	s, err := js.Stream(ctx, eventlog.StreamAssignments)
	require.NoError(t, err)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{eventlog.AllRecords}})
	require.NoError(t, err)
	cc, err := cons.Consume(func(m jetstream.Msg) {
		task, transition, _ := strings.Cut(strings.TrimPrefix(m.Subject(), eventlog.SubjectAssignment), ".")
		var body struct {
			Actor string    `json:"actor"`
			At    time.Time `json:"at"`
		}
		_ = json.Unmarshal(m.Data(), &body)
		r.mu.Lock()
		defer r.mu.Unlock()
		switch transition {
		case "dispatched": // by "pod-worker@<host>/<pid>/<random>"
			actor := strings.TrimPrefix(body.Actor, "pod-worker@")
			host, _, _ := strings.Cut(actor, "/")
			r.host[task] = host
		case "completed", "failed":
			if _, ok := r.ends[task]; !ok {
				r.ends[task] = body.At
			}
		}
	})
	require.NoError(t, err)
	t.Cleanup(cc.Stop)
	kv, err := js.KeyValue(ctx, eventlog.BucketCordons)
	require.NoError(t, err)
	w, err := kv.Watch(ctx, ">", jetstream.UpdatesOnly())
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Stop() })
	go func() {
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			// pod-worker.<host>/<pid>/<random>
			host, _, _ := strings.Cut(strings.TrimPrefix(e.Key(), "pod-worker."), "/")
			r.mu.Lock()
			if _, ok := r.held[host]; !ok {
				n := 0
				for task, h := range r.host {
					if _, ended := r.ends[task]; h == host && !ended {
						n++
					}
				}
				r.held[host] = n
			}
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *records) heldWhenCordoned(host string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held[host]
}

func (r *records) ended() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.ends) }

func (r *records) jobsByHost() map[string][]job {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]job{}
	for task, host := range r.host {
		out[host] = append(out[host], job{task: task, ended: r.ends[task]})
	}
	return out
}

func summary(jobs map[string][]job) string {
	var parts []string
	for _, h := range slices.Sorted(func(yield func(string) bool) {
		for h := range jobs {
			if !yield(h) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s:%d", h, len(jobs[h])))
	}
	return strings.Join(parts, " ")
}
