package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// runEvents follows the audit streams: every assignment transition and, unless
// --environments=false, every recorded environment phase, human-readable or as JSON.
// Records hold no secrets (the sealed task lives in a separate bucket), so nothing is masked.
func runEvents(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print each transition as one JSON object per line")
	task := fs.Int64("task", 0, "only this task id")
	follow := fs.Bool("follow", true, "keep following new transitions (false: print the history and exit)")
	envs := fs.Bool("environments", true, "also print the environments' records (Pod phases) from "+eventlog.StreamEnvironments)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := natsconn.Config{URL: os.Getenv("NATS_URL"), User: os.Getenv("NATS_USER"), Name: "dynrunner events"}
	if cfg.URL == "" {
		// A controller on embedded defaults: its NATS listens on loopback with a generated
		// password in its state directory.
		state := os.Getenv("STATE_DIR")
		if state == "" {
			home, _ := os.UserHomeDir()
			state = filepath.Join(home, ".local", "state", "dynrunner")
		}
		listen := os.Getenv("NATS_EMBEDDED_LISTEN")
		if listen == "" {
			listen = "127.0.0.1:4222"
		}
		pw, err := secretfile.Read(filepath.Join(state, embeddedPasswordFile))
		if err != nil {
			return fmt.Errorf("no NATS_URL, and no embedded NATS password in STATE_DIR=%s (is a controller running there?): %w", state, err)
		}
		cfg.URL, cfg.User, cfg.Password = "nats://"+listen, embeddedUser, string(pw)
	} else if f := os.Getenv("NATS_PASSWORD_FILE"); f != "" {
		pw, err := secretfile.Read(f)
		if err != nil {
			return fmt.Errorf("NATS_PASSWORD_FILE: %w", err)
		}
		cfg.Password = string(pw)
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
	filter, envFilter := eventlog.AllRecords, eventlog.SubjectEnvironment+"*"
	if *task > 0 {
		filter, envFilter = eventlog.Subject(assignment.TaskID(*task)), eventlog.EnvironmentSubject(assignment.TaskID(*task))
	}
	c, err := js.OrderedConsumer(ctx, eventlog.StreamAssignments, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("no %s stream: has a controller run against this NATS/STATE_DIR?", eventlog.StreamAssignments)
	}
	if err != nil {
		return err
	}
	var ec jetstream.Consumer
	if *envs {
		ec, err = js.OrderedConsumer(ctx, eventlog.StreamEnvironments, jetstream.OrderedConsumerConfig{FilterSubjects: []string{envFilter}})
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			ec = nil // a controller of a release without environment records
		case err != nil:
			return err
		}
	}
	var mu sync.Mutex // the two streams' lines, when following both
	emit := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(out, line)
	}
	printAssignment := func(msg jetstream.Msg) {
		md, _ := msg.Metadata()
		var rec assignment.Record
		if err := json.Unmarshal(msg.Data(), &rec); err != nil {
			emit(fmt.Sprintf("undecodable record on %s: %v", msg.Subject(), err))
			return
		}
		st := assignment.State{Record: rec, Seq: md.Sequence.Stream}
		if *asJSON {
			line, _ := json.Marshal(struct {
				Seq   uint64           `json:"seq"`
				Epoch assignment.Epoch `json:"epoch"`
				assignment.Record
			}{st.Seq, st.Epoch(), rec})
			emit(string(line))
			return
		}
		emit(formatEvent(st))
	}
	printEnvironment := func(msg jetstream.Msg) {
		md, _ := msg.Metadata()
		var rec eventlog.EnvironmentRecord
		if err := json.Unmarshal(msg.Data(), &rec); err != nil {
			emit(fmt.Sprintf("undecodable record on %s: %v", msg.Subject(), err))
			return
		}
		if *asJSON {
			line, _ := json.Marshal(struct {
				Kind string `json:"kind"`
				Seq  uint64 `json:"seq"`
				eventlog.EnvironmentRecord
			}{"environment", md.Sequence.Stream, rec})
			emit(string(line))
			return
		}
		emit(formatEnvironment(rec))
	}
	if !*follow {
		// The history: the assignments' records, then the environments'.
		tail(ctx, c, false, printAssignment)
		if ec != nil {
			tail(ctx, ec, false, printEnvironment)
		}
		return nil
	}
	var wg sync.WaitGroup
	if ec != nil {
		wg.Go(func() { tail(ctx, ec, true, printEnvironment) })
	}
	tail(ctx, c, true, printAssignment)
	wg.Wait()
	return nil
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
	field(&b, " repo=%s", s.Repo)
	field(&b, " job=%q", s.Job)
	field(&b, " result=%s", s.Result)
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
