package local

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// stop ends every process of environment id: the process groups of refs whose leader still is
// that process (a zombie leader included), the groups of refs whose leader is gone but where a
// process carrying the environment's marker remains (strays), and any other process carrying
// the marker (it left the group, or its handle was never written) or running as uid, the
// environment's own (noUID: none; such a process may have cleared its environment). It sends
// SIGTERM, waits up to the grace period, then SIGKILL. Zombies count as gone. It returns how
// many processes it found at first.
//
// A process group id cannot be reused while any member lives, so a group proven ours stays
// ours as long as every scan finds a member. A group whose leader is gone is proven through a
// marked member; without that proof the number may belong to a new group of a reused pid, and
// stop leaves it alone.
func (b *Backend) stop(ctx context.Context, id string, refs []procRef, uid int) (int, error) {
	marker := b.marker(id)
	groups := make(map[int]bool) // pgid of a ref -> proven ours
	for _, r := range refs {
		st, err := readStat(r.pid)
		groups[r.pgid] = groups[r.pgid] || (err == nil && st.Start == r.start)
	}
	// targets lists what still runs: members of proven groups, and marked processes outside them.
	targets := func() (pgids []int, procs []procInfo, n int, err error) {
		all, err := scanProcs(marker, uid)
		if err != nil {
			return nil, nil, 0, err
		}
		members := make(map[int]int)
		for _, p := range all {
			if _, known := groups[p.Pgrp]; known {
				members[p.Pgrp]++
				if p.marked {
					groups[p.Pgrp] = true
				}
			}
		}
		for pgid, proven := range groups {
			if proven && members[pgid] == 0 {
				groups[pgid] = false // empty now: the number is free for reuse
			}
			if groups[pgid] {
				pgids = append(pgids, pgid)
			}
		}
		for _, p := range all {
			switch {
			case groups[p.Pgrp]:
				n++
			case p.marked:
				procs = append(procs, p)
				n++
			}
		}
		return pgids, procs, n, nil
	}
	signal := func(sig syscall.Signal) (int, error) {
		pgids, procs, n, err := targets()
		if err != nil || n == 0 {
			return n, err
		}
		for _, g := range pgids {
			if err := signalGroup(g, sig); err != nil {
				return n, fmt.Errorf("signal group %d: %w", g, err)
			}
		}
		for _, p := range procs {
			if err := signalProc(p.PID, p.Start, sig); err != nil {
				return n, fmt.Errorf("signal %d: %w", p.PID, err)
			}
		}
		return n, nil
	}
	// await polls until nothing runs or until the deadline; with resend it signals again on
	// every round, which reaches processes forked meanwhile.
	await := func(ctx context.Context, deadline time.Time, sig syscall.Signal, resend bool) (bool, error) {
		backoff := 5 * time.Millisecond
		for {
			var n int
			var err error
			if resend {
				n, err = signal(sig)
			} else {
				_, _, n, err = targets()
			}
			if err != nil {
				return false, err
			}
			if n == 0 {
				return true, nil
			}
			wait := min(backoff, time.Until(deadline))
			if wait <= 0 {
				return false, nil
			}
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return false, nil // cut the wait short; the caller escalates
			}
			backoff = min(2*backoff, 100*time.Millisecond)
		}
	}

	found, err := signal(syscall.SIGTERM)
	if err != nil || found == 0 {
		return found, err
	}
	b.log.Debug().Str(logKeyEnv, id).Int("processes", found).Msg("sent SIGTERM")
	if done, err := await(ctx, time.Now().Add(b.grace), syscall.SIGTERM, false); done || err != nil {
		return found, err
	}
	b.log.Info().Str(logKeyEnv, id).Dur("grace", b.grace).Msg("grace period over, sending SIGKILL")
	// The kill completes even when ctx is done: a half-killed environment helps nobody.
	done, err := await(context.WithoutCancel(ctx), time.Now().Add(killWait), syscall.SIGKILL, true)
	if err != nil {
		return found, err
	}
	if !done {
		_, _, n, _ := targets()
		return found, fmt.Errorf("%d processes survived SIGKILL for %s", n, killWait)
	}
	return found, nil
}
