package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/config"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// eventsOptions are the flags of `dynrunner events`.
type eventsOptions struct {
	asJSON, follow, envs bool
	task                 int64
}

// parseEventsFlags parses the flags of `dynrunner events`.
func parseEventsFlags(args []string) (eventsOptions, error) {
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print each transition as one JSON object per line")
	task := fs.Int64("task", 0, "only this task id")
	follow := fs.Bool("follow", true, "keep following new transitions (false: print the history and exit)")
	envs := fs.Bool("environments", true, "also print the environments' records (Pod phases) from "+eventlog.StreamEnvironments)
	if err := fs.Parse(args); err != nil {
		return eventsOptions{}, err
	}
	return eventsOptions{asJSON: *asJSON, follow: *follow, envs: *envs, task: *task}, nil
}

// runEvents follows the audit streams: every assignment transition and, unless
// --environments=false, every recorded environment phase, human-readable or as JSON.
// Records hold no secrets (the sealed task lives in a separate bucket), so nothing is masked.
func runEvents(ctx context.Context, args []string, getenv func(string) string, out io.Writer) error {
	opts, err := parseEventsFlags(args)
	if err != nil {
		return err
	}
	cfg, err := eventsNATSConfig(getenv)
	if err != nil {
		return err
	}
	nc, err := natsconn.Connect(cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc.NC)
	if err != nil {
		return err
	}
	c, ec, err := eventsConsumers(ctx, js, opts)
	if err != nil {
		return err
	}
	p := &eventsPrinter{out: out, asJSON: opts.asJSON}
	if !opts.follow {
		// The history: the assignments' records, then the environments'.
		tail(ctx, c, false, p.assignment)
		if ec != nil {
			tail(ctx, ec, false, p.environment)
		}
		return nil
	}
	var wg sync.WaitGroup
	if ec != nil {
		wg.Go(func() { tail(ctx, ec, true, p.environment) })
	}
	tail(ctx, c, true, p.assignment)
	wg.Wait()
	return nil
}

// eventsNATSConfig is the NATS connection of `dynrunner events`: NATS_URL, NATS_USER and
// NATS_PASSWORD_FILE, or without NATS_URL the embedded server of a controller on embedded
// defaults.
func eventsNATSConfig(getenv func(string) string) (natsconn.Config, error) {
	cfg := natsconn.Config{URL: getenv("NATS_URL"), User: getenv("NATS_USER"), Name: "dynrunner events"}
	if cfg.URL == "" {
		// A controller on embedded defaults: its NATS listens on loopback with a generated
		// password in its state directory.
		state := cmp.Or(getenv("STATE_DIR"), config.DefaultStateDir())
		listen := cmp.Or(getenv("NATS_EMBEDDED_LISTEN"), config.DefaultNATSEmbeddedListen)
		pw, err := secretfile.Read(filepath.Join(state, embeddedPasswordFile))
		if err != nil {
			return cfg, fmt.Errorf("no NATS_URL, and no embedded NATS password in STATE_DIR=%s (is a controller running there?): %w", state, err)
		}
		cfg.URL, cfg.User, cfg.Password = "nats://"+listen, embeddedUser, string(pw)
	} else if f := getenv("NATS_PASSWORD_FILE"); f != "" {
		pw, err := secretfile.Read(f)
		if err != nil {
			return cfg, fmt.Errorf("NATS_PASSWORD_FILE: %w", err)
		}
		cfg.Password = string(pw)
	}
	return cfg, nil
}

// eventsConsumers opens ordered consumers on the assignments' stream and, with
// --environments, the environments' (nil when that stream does not exist), filtered to
// --task when given.
func eventsConsumers(ctx context.Context, js jetstream.JetStream, opts eventsOptions) (c, ec jetstream.Consumer, err error) {
	filter, envFilter := eventlog.AllRecords, eventlog.SubjectEnvironment+"*"
	if opts.task > 0 {
		filter, envFilter = eventlog.Subject(assignment.TaskID(opts.task)), eventlog.EnvironmentSubject(assignment.TaskID(opts.task))
	}
	c, err = js.OrderedConsumer(ctx, eventlog.StreamAssignments, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil, fmt.Errorf("no %s stream: has a controller run against this NATS/STATE_DIR?", eventlog.StreamAssignments)
	}
	if err != nil {
		return nil, nil, err
	}
	if !opts.envs {
		return c, nil, nil
	}
	ec, err = js.OrderedConsumer(ctx, eventlog.StreamEnvironments, jetstream.OrderedConsumerConfig{FilterSubjects: []string{envFilter}})
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return c, nil, nil // a controller of a release without environment records
	case err != nil:
		return nil, nil, err
	}
	return c, ec, nil
}

// eventsPrinter prints the records of both streams, one line each, as text or JSON.
type eventsPrinter struct {
	mu     sync.Mutex // the two streams' lines, when following both
	out    io.Writer
	asJSON bool
}

func (p *eventsPrinter) emit(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.out, line)
}

// assignment prints a record of the assignments' stream.
func (p *eventsPrinter) assignment(msg jetstream.Msg) {
	md, _ := msg.Metadata()
	var rec assignment.Record
	if err := json.Unmarshal(msg.Data(), &rec); err != nil {
		p.emit(fmt.Sprintf("undecodable record on %s: %v", msg.Subject(), err))
		return
	}
	st := assignment.State{Record: rec, Seq: md.Sequence.Stream}
	if p.asJSON {
		line, _ := json.Marshal(struct {
			Seq   uint64           `json:"seq"`
			Epoch assignment.Epoch `json:"epoch"`
			assignment.Record
		}{st.Seq, st.Epoch(), rec})
		p.emit(string(line))
		return
	}
	p.emit(formatEvent(st))
}

// environment prints a record of the environments' stream.
func (p *eventsPrinter) environment(msg jetstream.Msg) {
	md, _ := msg.Metadata()
	var rec eventlog.EnvironmentRecord
	if err := json.Unmarshal(msg.Data(), &rec); err != nil {
		p.emit(fmt.Sprintf("undecodable record on %s: %v", msg.Subject(), err))
		return
	}
	if p.asJSON {
		line, _ := json.Marshal(struct {
			Kind string `json:"kind"`
			Seq  uint64 `json:"seq"`
			eventlog.EnvironmentRecord
		}{"environment", md.Sequence.Stream, rec})
		p.emit(string(line))
		return
	}
	p.emit(formatEnvironment(rec))
}

// tail hands every message of c to handle until ctx ends or, without follow, until no message
// came for a second.
func tail(ctx context.Context, c jetstream.Consumer, follow bool, handle func(jetstream.Msg)) {
	for {
		mctx, cancel := context.WithTimeout(ctx, time.Second)
		if follow {
			cancel()
			mctx, cancel = context.WithCancel(ctx)
		}
		msg, err := c.Next(jetstream.FetchContext(mctx))
		cancel()
		if err != nil {
			if ctx.Err() != nil || !follow {
				return
			}
			continue
		}
		handle(msg)
	}
}

func formatEvent(s assignment.State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  seq=%-6d task=%-6d epoch=%-6d %-10s backend=%s actor=%s",
		s.At.UTC().Format(time.RFC3339), s.Seq, s.Task, s.Epoch(), s.Transition, s.Backend, s.Actor)
	if s.GitHub() {
		fmt.Fprintf(&b, " forge=github slot=%d scale_set=%d runner=%s", s.Task-assignment.SlotBase, s.ScaleSet, s.RunnerName)
		if s.RunnerID != 0 {
			fmt.Fprintf(&b, " runner_id=%d", s.RunnerID)
		}
		field(&b, " github_job=%s", s.GitHubJob)
		if s.RunID != 0 {
			fmt.Fprintf(&b, " run=%d", s.RunID)
		}
	}
	field(&b, " repo=%s", s.Repo)
	field(&b, " job=%q", s.Job)
	if s.Phase == assignment.Queued {
		fmt.Fprintf(&b, " queued_until=%s", s.QueueDeadline.UTC().Format(time.RFC3339))
	}
	field(&b, " result=%s", s.Result)
	if s.Lost {
		b.WriteString(" lost")
	}
	field(&b, " reason=%q", s.Reason)
	return b.String()
}

// formatEnvironment is the text line of an environment record; its second column, where an
// assignment's line has its sequence, says "env".
func formatEnvironment(r eventlog.EnvironmentRecord) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  %-10s task=%-6d epoch=%-6d %-10s env=%s backend=%s actor=%s",
		r.At.UTC().Format(time.RFC3339), "env", r.Task, r.Epoch, r.Phase, r.Env, r.Backend, r.Actor)
	field(&b, " pod_uid=%s", r.PodUID)
	field(&b, " node=%s", r.Node)
	field(&b, " reason=%q", r.Reason)
	field(&b, " message=%q", r.Message)
	return b.String()
}

// field appends value to b in format (" key=%s" or " key=%q") unless it is empty.
func field(b *strings.Builder, format, value string) {
	if value != "" {
		fmt.Fprintf(b, format, value)
	}
}
