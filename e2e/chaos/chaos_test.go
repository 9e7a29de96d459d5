package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
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

	"github.com/dynrunner/dynrunner/internal/devforge"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/testbed/fleetbed"
)

// The load: repos × pushes runs of chaosWorkflow, jobsPerRun jobs each.
const (
	repos      = 10
	pushes     = 2
	jobsPerRun = 5
	logLines   = 20
)

// chaosWorkflow's jobs print numbered lines over about 10 s, so faults land mid-job; j5
// fails on purpose. On a static runner j1..j4 succeed and j5 fails (the conclusions the
// parity tests compare); every job's log holds every line once, in order.
const chaosWorkflow = `name: chaos
on: [push]
jobs:
  j1: &job
    runs-on: [self-hosted, pod]
    steps:
      - name: lines
        run: |
          for i in $(seq 1 @N@); do echo "chaos line $i of @N@"; sleep 0.5; done
  j2: *job
  j3: *job
  j4: *job
  j5:
    runs-on: [self-hosted, pod]
    steps:
      - name: lines
        run: |
          for i in $(seq 1 @N@); do echo "chaos line $i of @N@"; sleep 0.5; done
          echo "failing on purpose"; exit 3
`

// wantConclusion is what a static runner concludes for each job of chaosWorkflow.
var wantConclusion = map[string]string{
	"j1": devforge.ConclusionSuccess, "j2": devforge.ConclusionSuccess, "j3": devforge.ConclusionSuccess,
	"j4": devforge.ConclusionSuccess, "j5": devforge.ConclusionFailure,
}

type pending struct {
	repo devforge.Repo
	sha  string
}

// TestChaosUnderLoad runs 100 jobs over 10 repositories of a real Gitea through dynrunner
// split over containers (3 NATS nodes, 2 schedulers, 2 facades, 2 pod workers) while it kills
// a pod worker mid-job, kills a scheduler, kills a NATS node, partitions another for 30 s and
// restarts every dynrunner container in turn. Every job must end as on a static runner with a
// complete log, every assignment with exactly one completed or failed record at its current
// epoch, and nothing may be left behind. It prints the time from each fault to recovery.
func TestChaosUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a multi-host deployment")
	}
	tools := fleetbed.Need(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Minute)
	defer cancel()

	began := time.Now()
	image, err := fleetbed.ExecutorImage(ctx, filepath.Join("..", ".."))
	require.NoError(t, err)
	t.Logf("executor image built in %s", time.Since(began).Round(100*time.Millisecond))
	bed, err := fleetbed.Start(ctx, fleetbed.Options{
		Dir: t.TempDir(), Tools: tools, ExecutorImage: image, PodConcurrency: 4,
		Env:    []string{"LEASE_SECS=90", "PICKUP_SECS=60", "KEEPALIVE_SECS=5"},
		Output: fleetbed.TestOutput{T: t},
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range bed.Role(fleetbed.RoleScheduler) {
				t.Logf("%s:\n%s", c.Name, fleetbed.Tail(c.Logs(context.Background()), 60))
			}
			for _, c := range append(bed.Role(fleetbed.RoleFacade), bed.Role(fleetbed.RolePodWorker)...) {
				t.Logf("%s:\n%s", c.Name, fleetbed.Tail(c.Logs(context.Background()), 60))
			}
		}
		assert.NoError(t, bed.Close(), "remove the bed")
	})

	// How often a view started reading the event log again (eventlog.ErrStalled, a bounded
	// listing that timed out, other transient JetStream errors), and why: what the faults cost
	// beyond the recovery times. Reported whether the test passes or fails, before the bed goes.
	t.Cleanup(func() {
		for _, c := range bed.Dynrunner {
			var again []string
			for _, l := range strings.Split(c.Logs(context.Background()), "\n") {
				if strings.Contains(l, "following the event log failed") {
					again = append(again, l)
				}
			}
			if len(again) > 0 {
				t.Logf("%s: its view read the event log again %d times:\n%s", c.Name, len(again), fleetbed.Tail(strings.Join(again, "\n"), 5))
			}
		}
	})
	rec := watchRecords(ctx, t, bed)

	// The load: two waves of one push per repository each, the second before the last fault,
	// so every fault lands while jobs run; the schedulers' capacity holds the rest of a wave in
	// Gitea's queue.
	wf := strings.ReplaceAll(chaosWorkflow, "@N@", fmt.Sprint(logLines))
	repoOf := make([]devforge.Repo, repos)
	for i := range repoOf {
		repoOf[i], err = bed.Forge.CreateRepo(ctx, fmt.Sprintf("chaos-%02d", i+1))
		require.NoError(t, err)
	}
	var runs []pending
	pushed := 0 // jobs pushed so far
	push := func(wave int) {
		t.Helper()
		for _, repo := range repoOf {
			sha, err := bed.Forge.PushFiles(ctx, repo, map[string]string{
				".gitea/workflows/chaos.yml": wf,
				"push.txt":                   fmt.Sprintf("push %d\n", wave),
			})
			require.NoError(t, err)
			runs = append(runs, pending{repo: repo, sha: sha})
			pushed += jobsPerRun
		}
		t.Logf("wave %d: pushed %d runs, %d jobs", wave, len(repoOf), len(repoOf)*jobsPerRun)
	}
	total := repos * pushes * jobsPerRun
	push(1)

	// The faults, one after the other, each once jobs are running.
	var recoveries []recovery
	fault := func(name string, do func() error) {
		t.Helper()
		waitMidJob(ctx, t, bed, rec, pushed)
		mark := rec.last()
		at := time.Now()
		require.NoError(t, do(), name)
		// Recovered: every container runs and is ready, and a job claimed after the fault
		// began has ended (the whole path works again: fetch, claim, start, run, report) or,
		// when the fault came after the last job of the waves pushed so far was claimed, every
		// job pushed so far has ended (the next fault's wave then proves the claims).
		err := bed.WaitRecovered(ctx, 5*time.Minute, func() bool { return rec.endedClaimedAfter(mark) || rec.ended() >= pushed })
		require.NoError(t, err, "recover from: %s", name)
		d := time.Since(at)
		recoveries = append(recoveries, recovery{name, d})
		t.Logf("fault %q: recovered (every container ready; a job claimed since, or every job pushed, ended) after %s", name, d.Round(100*time.Millisecond))
	}
	podWorker := bed.Container("pod-worker-1")
	fault("docker kill pod-worker-1 mid-job, then start it", func() error {
		if err := podWorker.Kill(ctx); err != nil {
			return err
		}
		return podWorker.Start(ctx)
	})
	scheduler := bed.Container("scheduler-1")
	fault("docker kill scheduler-1, then start it", func() error {
		if err := scheduler.Kill(ctx); err != nil {
			return err
		}
		return scheduler.Start(ctx)
	})
	natsNode := bed.Container("nats-2")
	fault("docker kill nats-2 for 10 s", func() error {
		if err := natsNode.Kill(ctx); err != nil {
			return err
		}
		time.Sleep(10 * time.Second) // the fault's length, not a wait for something
		return natsNode.Start(ctx)
	})
	partitioned := bed.Container("nats-3")
	fault("partition nats-3 for 30 s", func() error {
		if err := partitioned.Disconnect(ctx); err != nil {
			return err
		}
		time.Sleep(30 * time.Second) // the partition's length
		return partitioned.Connect(ctx)
	})
	push(2)
	fault("rolling restart of every dynrunner container", func() error {
		for _, c := range bed.Dynrunner {
			if err := c.Restart(ctx); err != nil {
				return err
			}
			if err := c.WaitReady(ctx, 2*time.Minute); err != nil {
				return err
			}
		}
		return nil
	})

	// Every job ends as on a static runner, with a complete log.
	jobs := 0
	for _, p := range runs {
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Minute)
		run, err := bed.Forge.WaitRun(wctx, p.repo, p.sha)
		wcancel()
		require.NoError(t, err, "run of %s at %s", p.repo, p.sha)
		for _, j := range run.Jobs {
			jobs++
			want, ok := wantConclusion[j.Name]
			require.True(t, ok, "unexpected job %q", j.Name)
			log, err := bed.Forge.JobLog(ctx, p.repo, j.ID)
			require.NoError(t, err)
			if !assert.Equal(t, want, j.Conclusion, "%s run %d job %s", p.repo, run.ID, j.Name) {
				t.Logf("log of %s job %s (runner %s):\n%s", p.repo, j.Name, j.RunnerName, fleetbed.Tail(log, 40))
				diagnose(ctx, t, bed, rec, p.repo, j)
			}
			if !assert.NoError(t, completeLog(log), "%s run %d job %s", p.repo, run.ID, j.Name) && j.Conclusion == want {
				t.Logf("log of %s job %s (runner %s):\n%s", p.repo, j.Name, j.RunnerName, fleetbed.Tail(log, 40))
				diagnose(ctx, t, bed, rec, p.repo, j)
			}
		}
	}
	assert.Equal(t, total, jobs, "jobs run")

	// Exactly one completed or failed per assignment, at the assignment's current epoch.
	require.Eventually(t, func() bool { return rec.ended() >= total }, 2*time.Minute, 500*time.Millisecond,
		"assignments ended in the event log: %d of %d", rec.ended(), total)
	double, stale := rec.check()
	assert.Empty(t, double, "assignments with more than one completed or failed record")
	assert.Empty(t, stale, "completed or failed records at an epoch older than the assignment's last claim")

	// After a reaper cycle (30 s) nothing is left: no job container, secrets directory or
	// environment key.
	assert.Eventually(t, func() bool { return len(leftovers(ctx, t, bed)) == 0 }, 2*time.Minute, time.Second,
		"left behind after the jobs: %v", leftovers(ctx, t, bed))

	t.Logf("chaos: %d jobs over %d repositories in %s; jobs lost: 0; double reports: %d; stale reports: %d",
		jobs, repos, time.Since(began).Round(time.Second), len(double), len(stale))
	for _, r := range recoveries {
		t.Logf("recovery: %-50s %s", r.fault, r.took.Round(100*time.Millisecond))
	}
}

type recovery struct {
	fault string
	took  time.Duration
}

// completeLog checks that a job's log holds every numbered line once, in order.
func completeLog(log string) error {
	next := 1
	for _, l := range strings.Split(log, "\n") {
		i := strings.Index(l, "chaos line ")
		if i < 0 || strings.Contains(l, "echo") || strings.Contains(l, "seq") {
			continue
		}
		var n, of int
		if _, err := fmt.Sscanf(l[i:], "chaos line %d of %d", &n, &of); err != nil {
			continue
		}
		if n != next {
			return fmt.Errorf("line %d where line %d was due", n, next)
		}
		next++
	}
	if next != logLines+1 {
		return fmt.Errorf("the log holds %d of %d lines", next-1, logLines)
	}
	return nil
}

// waitMidJob waits until job containers are running, or every job ended.
func waitMidJob(ctx context.Context, t *testing.T, bed *fleetbed.Bed, rec *records, total int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return len(jobContainers(ctx, t, bed)) >= 2 || rec.ended() >= total
	}, 5*time.Minute, 250*time.Millisecond, "no job running")
}

// records follows the assignment records from the host, as an operator's `nats sub` would.
type records struct {
	mu sync.Mutex
	// terminal counts completed and failed records per task, with their epochs; claims the
	// epochs of each task's claims and reclaims.
	terminal map[string][]uint64
	claims   map[string][]uint64
	// history holds every record of each task, one line each, for diagnosis; where the
	// repository and job each task is for.
	history map[string][]string
	where   map[string]string
	// seq is the last stream sequence seen.
	seq uint64
}

func watchRecords(ctx context.Context, t *testing.T, bed *fleetbed.Bed) *records {
	url, err := bed.NATSHostURL(ctx)
	require.NoError(t, err)
	user, pass := bed.NATSCredentials()
	nc, err := nats.Connect(url, nats.UserInfo(user, pass), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.PingInterval(5*time.Second), nats.MaxPingsOutstanding(3)) // a partitioned node is left within 15 s
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	r := &records{terminal: map[string][]uint64{}, claims: map[string][]uint64{}, history: map[string][]string{}, where: map[string]string{}}
	go func() {
		for ctx.Err() == nil {
			if err := r.follow(ctx, js); err != nil && ctx.Err() == nil {
				t.Logf("follow the assignment records (retrying): %v", err)
				time.Sleep(time.Second)
			}
		}
	}()
	return r
}

// follow reads every record from the start (an ordered consumer recreates itself across
// node failures), so it may see a record twice: it keeps each (stream sequence) once.
func (r *records) follow(ctx context.Context, js jetstream.JetStream) error {
	s, err := js.Stream(ctx, eventlog.StreamAssignments)
	if err != nil {
		return err
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{eventlog.AllRecords}})
	if err != nil {
		return err
	}
	seen := map[uint64]bool{}
	r.mu.Lock()
	r.terminal, r.claims = map[string][]uint64{}, map[string][]uint64{}
	r.history, r.where = map[string][]string{}, map[string]string{}
	r.mu.Unlock()
	cc, err := c.Consume(func(m jetstream.Msg) {
		md, err := m.Metadata()
		if err != nil || seen[md.Sequence.Stream] {
			return
		}
		seen[md.Sequence.Stream] = true
		r.mu.Lock()
		r.seq = max(r.seq, md.Sequence.Stream)
		r.mu.Unlock()
		rest := strings.TrimPrefix(m.Subject(), eventlog.SubjectAssignment)
		task, transition, _ := strings.Cut(rest, ".")
		var body struct {
			Epoch        uint64    `json:"epoch"`
			Seq          uint64    `json:"seq"`
			Phase        string    `json:"phase"`
			Actor        string    `json:"actor"`
			At           time.Time `json:"at"`
			Repo         string    `json:"repo"`
			Job          string    `json:"job"`
			Pickup       time.Time `json:"pickup_deadline"`
			LeaseExpires time.Time `json:"lease_expires"`
			Result       string    `json:"result"`
			Reason       string    `json:"reason"`
		}
		_ = json.Unmarshal(m.Data(), &body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.history[task] = append(r.history[task], fmt.Sprintf("seq %d %s: phase %s epoch %d by %s at %s; pickup %s lease %s result %q reason %q",
			md.Sequence.Stream, transition, body.Phase, body.Epoch, body.Actor, body.At.UTC().Format(time.RFC3339Nano),
			body.Pickup.UTC().Format(time.TimeOnly), body.LeaseExpires.UTC().Format(time.TimeOnly), body.Result, body.Reason))
		if transition == "claimed" {
			r.where[task] = body.Repo + " " + body.Job
		}
		switch transition {
		case "completed", "failed":
			r.terminal[task] = append(r.terminal[task], body.Epoch)
		case "claimed": // its own stream sequence is the epoch
			r.claims[task] = append(r.claims[task], md.Sequence.Stream)
		}
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	cc.Stop()
	return nil
}

// tasksOf returns the tasks claimed for job of repo (owner/name), each with its records.
func (r *records) tasksOf(repo, job string) map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]string{}
	for task, w := range r.where {
		if w == repo+" "+job {
			out[task] = slices.Clone(r.history[task])
		}
	}
	return out
}

// diagnose prints what explains a job that did not end as on a static runner: the records of
// its assignment (of every assignment of its repository and job name when its runner does not
// name the task: both waves' runs have one), and every line of the dynrunner containers' logs
// that names the task.
func diagnose(ctx context.Context, t *testing.T, bed *fleetbed.Bed, rec *records, repo devforge.Repo, j devforge.Job) {
	t.Helper()
	tasks := rec.tasksOf(repo.Owner+"/"+repo.Name, j.Name)
	// The executor registers its runner as dynrunner-<task>-<epoch>.
	var mine string
	if _, err := fmt.Sscanf(j.RunnerName, "dynrunner-%s", &mine); err == nil {
		mine, _, _ = strings.Cut(mine, "-")
	}
	if _, ok := tasks[mine]; ok {
		tasks = map[string][]string{mine: tasks[mine]}
	}
	if len(tasks) == 0 {
		t.Logf("no assignment records for %s/%s job %s (runner %q)", repo.Owner, repo.Name, j.Name, j.RunnerName)
	}
	for task, lines := range tasks {
		t.Logf("assignment records of task %s (%s/%s job %s):\n%s", task, repo.Owner, repo.Name, j.Name, strings.Join(lines, "\n"))
		needle := fmt.Sprintf(`"task_id":%s`, task)
		for _, c := range bed.Dynrunner {
			var hits []string
			for _, l := range strings.Split(c.Logs(ctx), "\n") {
				if strings.Contains(l, needle+",") || strings.Contains(l, needle+"}") {
					hits = append(hits, l)
				}
			}
			if len(hits) > 0 {
				t.Logf("%s lines on task %s:\n%s", c.Name, task, strings.Join(hits, "\n"))
			}
		}
	}
}

// ended counts the tasks with a completed or failed record.
func (r *records) ended() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.terminal)
}

// last is the last stream sequence seen.
func (r *records) last() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seq
}

// endedClaimedAfter reports whether an assignment claimed after stream sequence seq has ended.
func (r *records) endedClaimedAfter(seq uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for task := range r.terminal {
		if c := r.claims[task]; len(c) > 0 && c[len(c)-1] > seq {
			return true
		}
	}
	return false
}

// check returns the tasks with more than one completed or failed record, and those whose
// record names an epoch other than their last claim's.
func (r *records) check() (double, stale []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for task, epochs := range r.terminal {
		if len(epochs) > 1 {
			double = append(double, fmt.Sprintf("%s: %v", task, epochs))
		}
		claims := r.claims[task]
		if len(claims) == 0 || epochs[0] != claims[len(claims)-1] {
			stale = append(stale, fmt.Sprintf("%s: ended at epoch %v, claims %v", task, epochs, claims))
		}
	}
	slices.Sort(double)
	slices.Sort(stale)
	return double, stale
}

// leftovers lists job containers of the bed's scope, secrets directories in the pod workers'
// state and environment keys in the workers' bucket.
func leftovers(ctx context.Context, t *testing.T, bed *fleetbed.Bed) []string {
	left := jobContainers(ctx, t, bed)
	entries, _ := os.ReadDir(filepath.Join(bed.PodStateDir, "docker-envs"))
	for _, e := range entries {
		switch {
		case e.Name() == ".locks": // the backend's lock directory stays; its files must not
			locks, _ := os.ReadDir(filepath.Join(bed.PodStateDir, "docker-envs", e.Name()))
			for _, l := range locks {
				left = append(left, "lock file "+l.Name())
			}
		case e.IsDir():
			left = append(left, "secrets directory "+e.Name())
		}
	}
	keys, err := bed.EnvironmentKeys(ctx)
	if err != nil {
		left = append(left, "workers bucket: "+err.Error())
	}
	return append(left, keys...)
}

// jobContainers lists the job containers of the bed's scope.
func jobContainers(ctx context.Context, t *testing.T, bed *fleetbed.Bed) []string {
	names, err := bed.JobContainers(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("list job containers: %v", err)
	}
	return names
}
