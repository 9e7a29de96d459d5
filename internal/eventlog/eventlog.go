package eventlog

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// Names of the streams, subjects and buckets.
const (
	StreamAssignments  = "DYNRUNNER_ASSIGNMENTS"
	StreamDispatch     = "DYNRUNNER_DISPATCH"
	StreamDead         = "DYNRUNNER_DEAD"
	StreamEnvironments = "DYNRUNNER_ENVIRONMENTS"
	BucketTasks        = "dynrunner_tasks"
	// BucketWorkers holds the pod and vm workers' liveness keys and the key of every
	// environment naming the worker that watches it (package podworker says which keys).
	BucketWorkers = "dynrunner_workers"
	// BucketNonces holds one sealed record per microVM nonce the vm worker issued, keyed by
	// the nonce's SHA-256 (package vmworker).
	BucketNonces = "dynrunner_nonces"
	// BucketLeases holds the leases of work that one scheduler replica at a time does (package
	// scheduler, LeaseReconcile); a key expires Config.LeasesTTL after its holder last renewed it.
	BucketLeases = "dynrunner_leases"
	// BucketLive indexes the live assignments, so a start loads them without the history:
	// task.<task_id> per live assignment (its value the claim's sequence, the epoch), and
	// tail, the stream sequence through which the index is complete (Watch).
	BucketLive = "dynrunner_live"
	// BucketComponents holds one heartbeat per running component process (package liveness),
	// keyed <kind>.<instance>; a key expires Config.ComponentsTTL after its last beat, and a
	// process that stops deletes its own.
	BucketComponents = "dynrunner_components"
	// BucketCordons holds one key per cordoned (draining) worker process, its heartbeat key
	// (package liveness), value: who cordoned it and when. No TTL: a cordon holds until it is
	// lifted, or swept once its worker's heartbeat is gone.
	BucketCordons = "dynrunner_cordons"
	// BucketGitHubReruns holds one record per GitHub workflow run that lost a slot's
	// environment, run.<run_id>: whether and when its failed jobs are run again (package
	// forge/github, Reruns). History GitHubRerunsHistory; a key expires GitHubRerunsTTL after
	// its last write.
	BucketGitHubReruns = "dynrunner_github_reruns"

	SubjectAssignment = "dynrunner.assignment."
	// AllRecords matches every assignment record: dynrunner.assignment.<task_id>.<transition>.
	AllRecords         = SubjectAssignment + "*.*"
	SubjectDispatch    = "dynrunner.dispatch."
	SubjectDead        = "dynrunner.dead."
	SubjectEnvironment = "dynrunner.environment."
)

// Config sizes the topology.
type Config struct {
	// Replicas of every stream and bucket: 1 for the embedded server, 3 on a cluster.
	Replicas int
	// Retention keeps the assignment and environment history (the audit trail) this long.
	Retention time.Duration
	// DispatchMaxDeliver is how often a dispatch message is delivered before it is dead-lettered.
	DispatchMaxDeliver int
	// DispatchAckWait is how long a worker may hold a dispatch message without InProgress.
	DispatchAckWait time.Duration
	// Key authenticates every record, environment record and dispatch message the log writes,
	// and every one it reads back (HeaderMAC): at least MinKeySize bytes, the same in every
	// component. A message without a valid MAC is rejected, quarantined and reported.
	Key []byte
	// OnReject, when set, hears of every message the log rejected, once per message.
	OnReject func(Rejection)
	// WorkersTTL is how long a key in BucketWorkers outlives its last put: three of the
	// workers' heartbeats (DefaultWorkersTTL, when zero). Every component must use the same.
	WorkersTTL time.Duration
	// NoncesTTL is how long a nonce's record lives in BucketNonces, redeemed or not
	// (DefaultNoncesTTL, when zero).
	NoncesTTL time.Duration
	// LeasesTTL is how long a lease in BucketLeases outlives its holder's last renewal
	// (DefaultLeasesTTL, when zero): SCHEDULER_LEASE_SECS. Every component must use the same.
	LeasesTTL time.Duration
	// ComponentsTTL is how long a heartbeat in BucketComponents outlives its last put
	// (DefaultComponentsTTL, when zero): LIVENESS_TTL. Every component must use the same.
	ComponentsTTL time.Duration
	// OnIndexError, when set, hears of every failure to keep BucketLive: an append whose key
	// could not be updated, a view's repair that failed. Nothing is lost by one (the views
	// repair the index from the stream), but a start reads more records until it is repaired.
	OnIndexError func(error)
}

// Defaults of Config's TTLs.
const (
	DefaultWorkersTTL = 30 * time.Second
	DefaultNoncesTTL  = time.Hour
	DefaultLeasesTTL  = 15 * time.Second
	// DefaultComponentsTTL is LIVENESS_TTL's default.
	DefaultComponentsTTL = 30 * time.Second
)

// BucketGitHubReruns keeps this many revisions of each key, for the audit trail (`nats kv history`),
// and each for GitHubRerunsTTL: longer than GitHub accepts a rerun (30 days after the run), so
// a run's count of reruns outlives every rerun it could still get.
const (
	GitHubRerunsHistory = 16
	GitHubRerunsTTL     = 35 * 24 * time.Hour
)

// DefaultConfig is the single-node topology.
func DefaultConfig() Config {
	return Config{Replicas: 1, Retention: 7 * 24 * time.Hour, DispatchMaxDeliver: 5, DispatchAckWait: 30 * time.Second,
		WorkersTTL: DefaultWorkersTTL, NoncesTTL: DefaultNoncesTTL, LeasesTTL: DefaultLeasesTTL, ComponentsTTL: DefaultComponentsTTL}
}

// Log appends and reads assignment transitions.
type Log struct {
	cfg Config
	js  jetstream.JetStream
	// keyWriter is the handle WriteWorkers publishes on (newKeyWriter).
	keyWriter jetstream.JetStream
	asg       jetstream.Stream
	envs      jetstream.Stream
	tasks     jetstream.KeyValue
	workers   jetstream.KeyValue
	nonces    jetstream.KeyValue
	leases    jetstream.KeyValue
	live      jetstream.KeyValue
	comps     jetstream.KeyValue
	cordons   jetstream.KeyValue
	reruns    jetstream.KeyValue
	liveTTL   bool // purge markers in live expire
	keyed     keyedSet
	appended  appended // this Log's own appends, for its views
	sign      signer
	rejected  seen
}

// Open ensures the whole topology dynrunner uses exists, creating or updating every stream and
// bucket (the package doc lists them; no other package creates one), and returns a Log. A key
// shorter than MinKeySize fails with ErrShortKey.
func Open(ctx context.Context, js jetstream.JetStream, cfg Config) (*Log, error) {
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.WorkersTTL <= 0 {
		cfg.WorkersTTL = DefaultWorkersTTL
	}
	if cfg.NoncesTTL <= 0 {
		cfg.NoncesTTL = DefaultNoncesTTL
	}
	if cfg.LeasesTTL <= 0 {
		cfg.LeasesTTL = DefaultLeasesTTL
	}
	if cfg.ComponentsTTL <= 0 {
		cfg.ComponentsTTL = DefaultComponentsTTL
	}
	if len(cfg.Key) < MinKeySize {
		return nil, fmt.Errorf("%w: %d bytes, at least %d are required", ErrShortKey, len(cfg.Key), MinKeySize)
	}
	asg, err := ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        StreamAssignments,
		Description: "dynrunner assignment transitions, one subject per forge task and transition",
		Subjects:    []string{AllRecords},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.Retention,
		Duplicates:  2 * time.Minute,
		// Reads of an assignment's last record are direct gets, far cheaper than API requests.
		// Only on a single replica: a follower's direct get may lag the leader, and the facade
		// checks epochs on reads. Appends are compare-and-swap either way.
		AllowDirect: cfg.Replicas == 1,
	})
	if err != nil {
		return nil, fmt.Errorf("eventlog: stream %s: %w", StreamAssignments, err)
	}
	if _, err := ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        StreamDispatch,
		Description: "dynrunner dispatch work queue, one subject per backend",
		Subjects:    []string{SubjectDispatch + "*"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  10 * time.Minute,
	}); err != nil {
		return nil, fmt.Errorf("eventlog: stream %s: %w", StreamDispatch, err)
	}
	if _, err := ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        StreamDead,
		Description: "dynrunner dispatch messages that exhausted their deliveries",
		Subjects:    []string{SubjectDead + "*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      30 * 24 * time.Hour,
	}); err != nil {
		return nil, fmt.Errorf("eventlog: stream %s: %w", StreamDead, err)
	}
	envs, err := ensureStream(ctx, js, jetstream.StreamConfig{
		Name:        StreamEnvironments,
		Description: "dynrunner environment observations (Pod phases), one subject per forge task",
		Subjects:    []string{SubjectEnvironment + "*"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.Retention,
		Duplicates:  2 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("eventlog: stream %s: %w", StreamEnvironments, err)
	}
	tasks, err := ensureKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketTasks,
		Description: "dynrunner sealed forge tasks (AES-GCM), purged when the assignment ends",
		History:     1,
		// Purge markers (and anything a crash left) expire with the audit history.
		TTL:      cfg.Retention,
		Storage:  jetstream.FileStorage,
		Replicas: cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("eventlog: bucket %s: %w", BucketTasks, err)
	}
	workers, err := ensureTTLBucket(ctx, js, cfg, BucketWorkers, cfg.WorkersTTL,
		"dynrunner workers that are alive (base64url of the actor) and the environments they watch (env.<task>.<epoch>)")
	if err != nil {
		return nil, err
	}
	nonces, err := ensureTTLBucket(ctx, js, cfg, BucketNonces, cfg.NoncesTTL, "dynrunner single-use microVM nonces (sealed)")
	if err != nil {
		return nil, err
	}
	leases, err := ensureTTLBucket(ctx, js, cfg, BucketLeases, cfg.LeasesTTL,
		"dynrunner leases of work one scheduler replica does at a time (reconcile), value: the holder's actor")
	if err != nil {
		return nil, err
	}
	live, liveTTL, err := ensureLiveBucket(ctx, js, cfg)
	if err != nil {
		return nil, err
	}
	comps, err := ensureTTLBucket(ctx, js, cfg, BucketComponents, cfg.ComponentsTTL,
		"dynrunner component processes that are alive: <kind>.<instance>, value: the heartbeat (JSON)")
	if err != nil {
		return nil, err
	}
	cordons, err := ensureKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketCordons,
		Description: "dynrunner cordoned workers: <instance>, value: who cordoned it and when (JSON)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("eventlog: bucket %s: %w", BucketCordons, err)
	}
	reruns, err := ensureKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      BucketGitHubReruns,
		Description: "dynrunner GitHub workflow runs whose failed jobs are run again after a lost environment: run.<run_id>, value: the rerun record (JSON)",
		History:     GitHubRerunsHistory,
		TTL:         GitHubRerunsTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("eventlog: bucket %s: %w", BucketGitHubReruns, err)
	}
	key := hmac.New(sha256.New, cfg.Key)
	key.Write([]byte("dynrunner event records v1"))
	keyWriter, err := newKeyWriter(js.Conn())
	if err != nil {
		return nil, fmt.Errorf("eventlog: %w", err)
	}
	return &Log{cfg: cfg, js: js, keyWriter: keyWriter, asg: asg, envs: envs, tasks: tasks, workers: workers, nonces: nonces, leases: leases, live: live, comps: comps, cordons: cordons, reruns: reruns, liveTTL: liveTTL,
		sign: signer{key: key.Sum(nil)}}, nil
}

// Workers returns BucketWorkers, the workers' liveness bucket. Its keys expire
// Config.WorkersTTL after their last put.
func (l *Log) Workers() jetstream.KeyValue { return l.workers }

// Nonces returns BucketNonces, the vm worker's nonce bucket. Its records expire
// Config.NoncesTTL after they were written.
func (l *Log) Nonces() jetstream.KeyValue { return l.nonces }

// Leases returns BucketLeases, the scheduler replicas' lease bucket. A key expires
// Config.LeasesTTL after its last put; a lease is taken with Create and renewed with Update on
// the revision its holder last wrote (package scheduler).
func (l *Log) Leases() jetstream.KeyValue { return l.leases }

// Components returns BucketComponents, the component processes' heartbeats (package
// liveness). Its keys expire Config.ComponentsTTL after their last put.
func (l *Log) Components() jetstream.KeyValue { return l.comps }

// Cordons returns BucketCordons, the cordoned workers (package liveness: Cordon).
func (l *Log) Cordons() jetstream.KeyValue { return l.cordons }

// GitHubReruns returns BucketGitHubReruns, the GitHub workflow runs to run again (package
// forge/github: Reruns).
func (l *Log) GitHubReruns() jetstream.KeyValue { return l.reruns }

// ensureStream returns the stream as configured, creating or updating it only when it is
// missing or differs: a component whose NATS user may only look streams up (docs/security.md)
// opens the log once the streams exist.
func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, want.Name)
	if err == nil {
		have := s.CachedInfo().Config
		if have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) && have.Retention == want.Retention &&
			have.Storage == want.Storage && have.Replicas == want.Replicas && have.MaxAge == want.MaxAge &&
			(want.Duplicates == 0 || have.Duplicates == want.Duplicates) && have.AllowDirect == want.AllowDirect {
			return s, nil
		}
	}
	return js.CreateOrUpdateStream(ctx, want)
}

// ensureTTLBucket ensures a one-value-per-key bucket whose keys expire ttl after their last put.
func ensureTTLBucket(ctx context.Context, js jetstream.JetStream, cfg Config, bucket string, ttl time.Duration, description string) (jetstream.KeyValue, error) {
	kv, err := ensureKeyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: description,
		History:     1,
		TTL:         ttl,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("eventlog: bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// ensureKeyValue is jetstream's CreateOrUpdateKeyValue that only looks the bucket up when it
// exists as configured, so a component whose NATS user may not change buckets binds to one.
func ensureKeyValue(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if kv, err := js.KeyValue(ctx, want.Bucket); err == nil {
		if st, err := kv.Status(ctx); err == nil {
			if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
				have := s.StreamInfo().Config
				if have.Description == want.Description && have.MaxMsgsPerSubject == max(int64(want.History), 1) && have.MaxAge == want.TTL &&
					have.Replicas == max(want.Replicas, 1) && have.Storage == want.Storage {
					return kv, nil
				}
			}
		}
	}
	return js.CreateOrUpdateKeyValue(ctx, want)
}

// Check reports whether the topology is usable: every stream and bucket exists and its
// leader answers. A stream deleted or a bucket removed behind the controller's back makes
// every job fail; /readyz shows it with Check's error, which names what is missing.
func (l *Log) Check(ctx context.Context) error {
	var errs []error
	for _, name := range []string{StreamAssignments, StreamDispatch, StreamDead, StreamEnvironments, "KV_" + BucketTasks, "KV_" + BucketWorkers, "KV_" + BucketNonces, "KV_" + BucketLeases, "KV_" + BucketLive, "KV_" + BucketComponents, "KV_" + BucketCordons, "KV_" + BucketGitHubReruns} {
		if _, err := l.js.Stream(ctx, name); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				err = fmt.Errorf("eventlog: stream %s is missing (deleted?); restart the controller to create it again: %w", name, err)
			} else {
				err = fmt.Errorf("eventlog: stream %s: %w", name, err)
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Config returns the topology's configuration.
func (l *Log) Config() Config { return l.cfg }

// Subject returns the subjects of a task's records: dynrunner.assignment.<task_id>.*, one
// per transition (RecordSubject).
func Subject(task assignment.TaskID) string { return SubjectAssignment + task.String() + ".*" }

// Get reads the current state of a task's assignment; assignment.ErrNotFound if it has none.
// Records the log rejects are skipped (and quarantined): the state is the last authentic one.
func (l *Log) Get(ctx context.Context, task assignment.TaskID) (assignment.State, error) {
	st, _, err := l.read(ctx, task)
	return st, err
}

// maxScan bounds how many messages of one task read walks when its last record is rejected.
const maxScan = 1024

// read is Get, and also returns the sequence of the task's last message, authentic or not:
// the compare-and-swap of the next append expects it.
func (l *Log) read(ctx context.Context, task assignment.TaskID) (assignment.State, uint64, error) {
	subject := Subject(task)
	msg, err := l.asg.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return assignment.State{}, 0, fmt.Errorf("eventlog: task %d: %w", task, assignment.ErrNotFound)
	}
	if err != nil {
		return assignment.State{}, 0, fmt.Errorf("eventlog: read task %d: %w", task, err)
	}
	msgSubject, msgSeq, err := l.origin(msg)
	st, derr := assignment.State{}, err
	if err == nil {
		st, derr = l.decodeRecord(msgSubject, msg.Header, msg.Data, msgSeq)
	}
	if derr == nil {
		return st, msgSeq, nil
	}
	l.quarantine(ctx, l.asg, StreamAssignments, msgSubject, msgSeq, msg.Data, derr)
	// Walk the task's messages for the last authentic record.
	head := msgSeq
	var last *assignment.State
	for seq, n := uint64(1), 0; seq <= head; n++ {
		if n == maxScan {
			return assignment.State{}, head, fmt.Errorf("eventlog: task %d: more than %d messages since its last authentic record: %w", task, maxScan, ErrRejected)
		}
		m, err := l.asg.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return assignment.State{}, head, fmt.Errorf("eventlog: read task %d: %w", task, err)
		}
		subj, mseq, err := l.origin(m)
		if err == nil {
			var s assignment.State
			if s, err = l.decodeRecord(subj, m.Header, m.Data, mseq); err == nil {
				last = &s
			}
		}
		if err != nil {
			l.quarantine(ctx, l.asg, StreamAssignments, subj, mseq, m.Data, err)
		}
		head = max(head, mseq) // appended meanwhile
		seq = mseq + 1
	}
	if last == nil {
		return assignment.State{}, head, fmt.Errorf("eventlog: task %d holds no authentic record: %w", task, assignment.ErrNotFound)
	}
	return *last, head, nil
}

// maxConflicts bounds the retries of one Apply against concurrent appends to the same task.
const maxConflicts = 16

// Apply decides ev against the task's current state and appends the result with
// compare-and-swap, re-reading and re-deciding on a conflicting append. hint, when not nil, is
// a recently seen state used instead of a first read. assignment.ErrNoChange is returned, with
// the current state, when ev is already in effect.
func (l *Log) Apply(ctx context.Context, ev assignment.Event, hint *assignment.State) (assignment.State, error) {
	var cur *assignment.State
	if hint != nil && hint.Task == ev.Task {
		h := *hint
		cur = &h
	}
	fresh := cur == nil
	// A claim is for a task without an assignment: append it expecting an empty subject
	// instead of reading first; a conflict means the task has one, and the re-read says so.
	skipRead := ev.Transition == assignment.Claimed && cur == nil
	if skipRead {
		fresh = false
	}
	var head uint64 // the task's last sequence, when it is not cur's (rejected records follow)
	// known is a sequence the task's records are known to reach (the hint's): a read that ends
	// before it is stale. On an R3 stream, a read right after an acknowledged append has been
	// seen to return the record before it for a moment (BenchmarkLifecyclesCluster: the
	// facade's Register refused as "registered in phase dispatched" although the worker's
	// `started` was acknowledged); deciding on it would refuse a valid transition.
	var known uint64
	if cur != nil {
		known = cur.Seq
	}
	for attempt := range maxConflicts {
		if cur == nil && !skipRead {
			s, h, err := l.read(ctx, ev.Task)
			switch {
			case err == nil && h < known:
				// Stale: read again after a moment.
				t := time.NewTimer(time.Duration(attempt+1) * 2 * time.Millisecond)
				select {
				case <-ctx.Done():
					t.Stop()
					return assignment.State{}, ctx.Err()
				case <-t.C:
				}
				continue
			case err == nil:
				cur = &s
			case !errors.Is(err, assignment.ErrNotFound):
				return assignment.State{}, err
			}
			head, fresh = h, true
		}
		rec, err := assignment.Decide(cur, ev)
		if err != nil {
			if !fresh {
				// The hint may be stale (or a claim's guess that the task has none was
				// wrong): decide again on what JetStream holds.
				cur, skipRead = nil, false
				continue
			}
			if cur != nil {
				return *cur, err
			}
			return assignment.State{}, err
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return assignment.State{}, fmt.Errorf("eventlog: encode record: %w", err)
		}
		if max := l.MaxPayload(); int64(len(data)) > max-msgOverhead {
			return assignment.State{}, fmt.Errorf("eventlog: the %s record of task %d is %d bytes, more than the %d bytes a message to the NATS server may hold: %w",
				ev.Transition, ev.Task, len(data), max, ErrTooLarge)
		}
		last := head
		if cur != nil {
			last = max(last, cur.Seq)
		}
		msg := nats.NewMsg(RecordSubject(ev.Task, rec.Transition))
		msg.Data = data
		msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(last, 10))
		msg.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, Subject(ev.Task))
		l.sign.sign(msg)
		ack, err := l.js.PublishMsg(ctx, msg)
		if isConflict(err) {
			cur, skipRead, fresh, head = nil, false, false, 0
			continue
		}
		if err != nil {
			return assignment.State{}, fmt.Errorf("eventlog: append %s for task %d: %w", ev.Transition, ev.Task, err)
		}
		st := assignment.State{Record: rec, Seq: ack.Sequence}
		l.appended.add(msg.Subject, data, st)
		if err := l.index(ctx, st); err != nil {
			l.reportIndex(fmt.Errorf("eventlog: after the %s of task %d (the views repair it): %w", ev.Transition, ev.Task, err))
		}
		return st, nil
	}
	return assignment.State{}, fmt.Errorf("eventlog: append %s for task %d: %w", ev.Transition, ev.Task, ErrContention)
}

// The headers a direct get answers with. A message stored with any of them was published by
// someone trying to pass it off as another: nats.go reads the first value of each, which is
// the stored one, and the server's comes after it.
var originHeaders = []string{jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.SubjectHeader, jetstream.TimeStampHeaer}

// origin returns the subject and sequence the server gave m, read back from the assignments
// stream, and an ErrUnauthenticated error when m was stored with headers that pretend to be
// the server's.
func (l *Log) origin(m *jetstream.RawStreamMsg) (string, uint64, error) {
	direct := l.asg.CachedInfo().Config.AllowDirect
	subject, seq, spoofed := m.Subject, m.Sequence, false
	for _, h := range originHeaders {
		vs := m.Header.Values(h)
		if (direct && len(vs) > 1) || (!direct && len(vs) > 0) {
			spoofed = true
		}
	}
	if !spoofed {
		return subject, seq, nil
	}
	if direct {
		// The server's values are the last ones.
		if vs := m.Header.Values(jetstream.SubjectHeader); len(vs) > 0 {
			subject = vs[len(vs)-1]
		}
		if vs := m.Header.Values(jetstream.SequenceHeader); len(vs) > 0 {
			if n, err := strconv.ParseUint(vs[len(vs)-1], 10, 64); err == nil {
				seq = n
			}
		}
	}
	return subject, seq, fmt.Errorf("eventlog: message %d on %s was stored with headers that pretend to be the server's: %w", seq, subject, ErrUnauthenticated)
}

// ErrContention: an append lost the compare-and-swap race too often.
var ErrContention = errors.New("eventlog: too many conflicting appends")

func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// DispatchMsg is the body of a dispatch message.
type DispatchMsg struct {
	Task  assignment.TaskID `json:"task_id"`
	Epoch assignment.Epoch  `json:"epoch"`
}

// Dispatch publishes the work item for a claimed assignment on its backend's subject,
// deduplicated by task and epoch so a republish after a crash is harmless.
func (l *Log) Dispatch(ctx context.Context, backend assignment.Backend, task assignment.TaskID, epoch assignment.Epoch) error {
	msg := nats.NewMsg(SubjectDispatch + string(backend))
	msg.Data, _ = json.Marshal(DispatchMsg{Task: task, Epoch: epoch})
	msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("dispatch-%d-%d", task, epoch))
	l.sign.sign(msg)
	if _, err := l.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("eventlog: dispatch task %d to %s: %w", task, backend, err)
	}
	return nil
}

// ParseDispatch verifies and decodes a dispatch message: one without a valid MAC fails with
// ErrUnauthenticated, a body that is not a dispatch (ParseDispatchBody) with its error.
func (l *Log) ParseDispatch(msg jetstream.Msg) (DispatchMsg, error) {
	if err := l.sign.verify(msg.Subject(), msg.Headers(), msg.Data()); err != nil {
		return DispatchMsg{}, err
	}
	return ParseDispatchBody(msg.Data())
}

// ParseDispatchBody decodes a dispatch message body.
func ParseDispatchBody(data []byte) (DispatchMsg, error) {
	var m DispatchMsg
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return DispatchMsg{}, fmt.Errorf("eventlog: dispatch message: %w", err)
	}
	if m.Task <= 0 || m.Epoch == 0 {
		return DispatchMsg{}, fmt.Errorf("eventlog: dispatch message without task id or epoch: %w", assignment.ErrInvalidID)
	}
	return m, nil
}

// Consumer creates or updates the durable consumer of a backend's dispatch subject.
func (l *Log) Consumer(ctx context.Context, backend assignment.Backend) (jetstream.Consumer, error) {
	c, err := l.js.CreateOrUpdateConsumer(ctx, StreamDispatch, jetstream.ConsumerConfig{
		Durable:       "worker-" + string(backend),
		Description:   "dynrunner " + string(backend) + " worker",
		FilterSubject: SubjectDispatch + string(backend),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       l.cfg.DispatchAckWait,
		MaxDeliver:    l.cfg.DispatchMaxDeliver,
		MaxAckPending: 1024,
	})
	if err != nil {
		return nil, fmt.Errorf("eventlog: consumer for %s: %w", backend, err)
	}
	return c, nil
}

// DeadLetter records a dispatch message that will not be delivered again, with why.
func (l *Log) DeadLetter(ctx context.Context, backend assignment.Backend, data []byte, reason string) error {
	msg := nats.NewMsg(SubjectDead + string(backend))
	msg.Data = data
	msg.Header.Set("Dynrunner-Reason", reason)
	if _, err := l.js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("eventlog: dead-letter for %s: %w", backend, err)
	}
	return nil
}

// taskKey is a sealed task's key in BucketTasks: task.<id> for a Gitea task, jit.<id> for a
// GitHub slot's JIT configuration, so the workers' NATS users may read the latter (they start
// a slot's environment with it) and never the former (deploy/nats/permissions.conf).
func taskKey(task assignment.TaskID) string {
	if task.Slot() {
		return "jit." + task.String()
	}
	return "task." + task.String()
}

// PutTask stores a sealed task, only if the task has none (a KV create): two schedulers handed
// the same task never overwrite each other's. Storing the same bytes again (a retry) succeeds;
// other bytes fail with assignment.ErrExists.
func (l *Log) PutTask(ctx context.Context, task assignment.TaskID, sealed []byte) error {
	if max := l.MaxPayload(); int64(len(sealed)) > max-msgOverhead {
		return fmt.Errorf("eventlog: task %d is %d bytes sealed, more than the %d bytes a message to the NATS server may hold (its max_payload, less %d for the message's headers): %w",
			task, len(sealed), max, msgOverhead, ErrTooLarge)
	}
	_, err := l.tasks.Create(ctx, taskKey(task), sealed)
	if errors.Is(err, jetstream.ErrKeyExists) {
		e, gerr := l.tasks.Get(ctx, taskKey(task))
		switch {
		case gerr != nil:
			err = fmt.Errorf("%w (reading it back: %w)", err, gerr)
		case bytes.Equal(e.Value(), sealed):
			return nil
		default:
			return fmt.Errorf("eventlog: task %d is stored by another claim: %w", task, assignment.ErrExists)
		}
	}
	if err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			err = fmt.Errorf("%w: %w", ErrTooLarge, err)
		}
		return fmt.Errorf("eventlog: store task %d: %w", task, err)
	}
	return nil
}

// ErrTooLarge: a record or task does not fit into one NATS message. Retrying cannot help.
var ErrTooLarge = errors.New("too large for the event bus")

// msgOverhead is what a message needs besides its payload: subject and headers.
const msgOverhead = 1024

// MaxPayload is the largest message the NATS server accepts (its max_payload; 1 MiB unless
// configured otherwise).
func (l *Log) MaxPayload() int64 { return l.js.Conn().MaxPayload() }

// GetTask reads a sealed task; assignment.ErrNotFound when it was dropped.
func (l *Log) GetTask(ctx context.Context, task assignment.TaskID) ([]byte, error) {
	e, err := l.tasks.Get(ctx, taskKey(task))
	if errors.Is(err, jetstream.ErrKeyNotFound) && l.cfg.Replicas > 1 {
		// A KV get is a direct get, which on a cluster a follower may answer before it holds
		// the scheduler's put (BenchmarkLifecyclesCluster saw the facade's FetchTask fail so):
		// ask the bucket's stream leader before saying there is none.
		return l.leaderGetTask(ctx, task)
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("eventlog: sealed task %d: %w", task, assignment.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("eventlog: read task %d: %w", task, err)
	}
	return e.Value(), nil
}

// leaderGetTask reads a sealed task through the stream API (STREAM.MSG.GET), which the
// stream's leader answers, rather than a direct get any replica may answer.
func (l *Log) leaderGetTask(ctx context.Context, task assignment.TaskID) ([]byte, error) {
	req, err := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{"$KV." + BucketTasks + "." + taskKey(task)})
	if err != nil {
		return nil, err
	}
	m, err := l.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+BucketTasks, req)
	if err != nil {
		return nil, fmt.Errorf("eventlog: read task %d from the leader: %w", task, err)
	}
	var resp struct {
		Message *struct {
			Data    []byte `json:"data"`
			Headers []byte `json:"hdrs"`
		} `json:"message"`
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("eventlog: read task %d from the leader: %w", task, err)
	}
	switch {
	case resp.Error != nil && resp.Error.Code == 404:
		return nil, fmt.Errorf("eventlog: sealed task %d: %w", task, assignment.ErrNotFound)
	case resp.Error != nil:
		return nil, fmt.Errorf("eventlog: read task %d from the leader: %s", task, resp.Error.Description)
	case resp.Message == nil || bytes.Contains(resp.Message.Headers, []byte("KV-Operation")):
		// A delete or purge marker: the task was dropped.
		return nil, fmt.Errorf("eventlog: sealed task %d: %w", task, assignment.ErrNotFound)
	}
	return resp.Message.Data, nil
}

// DropTask purges a sealed task and its history: the end of its secret material.
func (l *Log) DropTask(ctx context.Context, task assignment.TaskID) error {
	if err := l.tasks.Purge(ctx, taskKey(task)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("eventlog: drop task %d: %w", task, err)
	}
	return nil
}
