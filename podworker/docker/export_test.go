package docker

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
