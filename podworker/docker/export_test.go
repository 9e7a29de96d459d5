package docker

import "time"

// EventSubscriptions returns how many times b subscribed to the engine's event stream.
func EventSubscriptions(b *Backend) int64 { return b.notes.subscriptions.Load() }

// EventsRunning reports whether b's event stream runs (subscribed or reconnecting).
func EventsRunning(b *Backend) bool {
	b.notes.mu.Lock()
	defer b.notes.mu.Unlock()
	return b.notes.cur != nil
}

// HangUpEvents ends b's open subscription to the event stream, as an engine restart would;
// it reports false when none is open.
func HangUpEvents(b *Backend) bool {
	n := b.notes
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cur == nil || !n.cur.connected {
		return false
	}
	n.cur.hangUp()
	return true
}

// SetBeforeSubscribe makes b call f before each subscription to the event stream, and replay
// no events from before it (so only the inspection after subscribing can find an end the
// stream missed). Call it before b's first Notify.
func SetBeforeSubscribe(b *Backend, f func()) {
	b.notes.beforeSubscribe = f
	b.notes.replay = 0
}

// SetBeforeInspect makes b call f with its number before each inspection of a container
// registered with Notify. Call it before b's first Notify.
func SetBeforeInspect(b *Backend, f func(int64)) { b.notes.beforeInspect = f }

// Inspecting reports whether an inspection of a registered container is under way.
func Inspecting(b *Backend) bool {
	b.notes.mu.Lock()
	defer b.notes.mu.Unlock()
	for _, set := range b.notes.regs {
		for r := range set {
			if r.checking {
				return true
			}
		}
	}
	return false
}

// Inspections returns how many inspections of registered containers b started.
func Inspections(b *Backend) int64 { return b.notes.inspections.Load() }

// SetRecheck makes b inspect every registered container every d while it follows the event
// stream. Call it before b's first Notify.
func SetRecheck(b *Backend, d time.Duration) { b.notes.recheck = d }
