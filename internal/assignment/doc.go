// Package assignment is dynrunner's state machine for one forge task: the records appended to
// JetStream for every transition, and Decide, the pure function that computes the next record
// from the current state and an event. Decide does no I/O and reads no clock; the event log
// (package eventlog) appends its result with compare-and-swap and retries on conflict.
//
// The fencing epoch of an assignment is the stream sequence of the append that handed it over
// (its claim). Every later event carries the epoch its sender holds; a stale one is rejected
// with ErrStaleEpoch.
package assignment
