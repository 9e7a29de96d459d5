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
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/eventlog"
	"github.com/dynrunner/dynrunner/internal/natsconn"
	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// runEvents follows the audit stream: every assignment transition, human-readable or as JSON.
// Records hold no secrets (the sealed task lives in a separate bucket), so nothing is masked.
func runEvents(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print each transition as one JSON object per line")
	task := fs.Int64("task", 0, "only this task id")
	follow := fs.Bool("follow", true, "keep following new transitions (false: print the history and exit)")
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
	filter := eventlog.SubjectAssignment + "*"
	if *task > 0 {
		filter = eventlog.Subject(assignment.TaskID(*task))
	}
	c, err := js.OrderedConsumer(ctx, eventlog.StreamAssignments, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("no %s stream: has a controller run against this NATS/STATE_DIR?", eventlog.StreamAssignments)
	}
	if err != nil {
		return err
	}
	for {
		mctx, cancel := context.WithTimeout(ctx, time.Second)
		if *follow {
			cancel()
			mctx, cancel = context.WithCancel(ctx)
		}
		msg, err := c.Next(jetstream.FetchContext(mctx))
		cancel()
		if err != nil {
			if ctx.Err() != nil || !*follow {
				return nil
			}
			continue
		}
		md, _ := msg.Metadata()
		var rec assignment.Record
		if err := json.Unmarshal(msg.Data(), &rec); err != nil {
			fmt.Fprintf(out, "undecodable record on %s: %v\n", msg.Subject(), err)
			continue
		}
		st := assignment.State{Record: rec, Seq: md.Sequence.Stream}
		if *asJSON {
			line, _ := json.Marshal(struct {
				Seq   uint64           `json:"seq"`
				Epoch assignment.Epoch `json:"epoch"`
				assignment.Record
			}{st.Seq, st.Epoch(), rec})
			fmt.Fprintln(out, string(line))
			continue
		}
		fmt.Fprintln(out, formatEvent(st))
	}
}

func formatEvent(s assignment.State) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s  seq=%-6d task=%-6d epoch=%-6d %-10s backend=%s actor=%s",
		s.At.UTC().Format(time.RFC3339), s.Seq, s.Task, s.Epoch(), s.Transition, s.Backend, s.Actor)
	if s.Repo != "" {
		fmt.Fprintf(&b, " repo=%s", s.Repo)
	}
	if s.Job != "" {
		fmt.Fprintf(&b, " job=%q", s.Job)
	}
	if s.Result != "" {
		fmt.Fprintf(&b, " result=%s", s.Result)
	}
	if s.Reason != "" {
		fmt.Fprintf(&b, " reason=%q", s.Reason)
	}
	return b.String()
}
