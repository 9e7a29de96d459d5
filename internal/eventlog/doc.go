// Package eventlog is dynrunner's JetStream topology and the compare-and-swap appender for
// assignment transitions.
//
// Open creates every stream and bucket dynrunner uses; no other package creates one. The
// buckets other components keep their state in are reached through the Log (Workers, Nonces, Leases, Live, Components,
// Cordons, GitHubReruns).
//
// Streams, subjects and buckets (see docs/events.md):
//
//	DYNRUNNER_ASSIGNMENTS   dynrunner.assignment.<task_id>.<transition>  every transition, JSON, limits retention
//	DYNRUNNER_DISPATCH      dynrunner.dispatch.<backend>     work queue, one durable consumer per backend
//	DYNRUNNER_DEAD          dynrunner.dead.<backend>         dispatch messages that exhausted MaxDeliver
//	                        dynrunner.dead.record            rejected messages, quarantined
//	DYNRUNNER_ENVIRONMENTS  dynrunner.environment.<task_id>  environment observations (Pod phases), JSON, limits retention
//	KV dynrunner_tasks      task.<task_id>                   the sealed forge task (AES-GCM), purged at the end
//	KV dynrunner_workers    env.<task>.<epoch>, workers      which worker watches each environment (package podworker), TTL Config.WorkersTTL
//	KV dynrunner_nonces     SHA-256 of a nonce               single-use microVM nonces (package vmworker), TTL Config.NoncesTTL
//	KV dynrunner_leases     reconcile                        which scheduler replica reconciles (package scheduler), TTL Config.LeasesTTL
//	KV dynrunner_live       task.<task_id>, tail             the index of live assignments a start loads (Watch)
//	KV dynrunner_components <kind>.<instance>                one heartbeat per component process (package liveness), TTL Config.ComponentsTTL
//	KV dynrunner_cordons    <kind>.<instance>                the cordoned workers (package liveness)
//	KV dynrunner_github_reruns run.<run_id>                  GitHub runs to run again after a lost environment (package forge/github), history 16, TTL 35 days
//
// Every transition is exactly one publish guarded by Nats-Expected-Last-Subject-Sequence over
// the task's subjects; the claim's stream sequence is the assignment's fencing epoch. Every
// message the log writes carries a MAC (HeaderMAC) under Config.Key, and every one it reads
// must: a message without one is not believed, but quarantined (SubjectQuarantine) and
// reported (Config.OnReject).
// Environment records are plain appends (RecordEnvironment), deduplicated by message id: they
// are an audit trail beside the assignment's, never an input to its state machine.
//
// A start costs the live assignments, not the history: Watch loads the tasks BucketLive names
// and the records after its tail, and a View keeps the live assignments and the last MaxEnded
// that ended; older ones are read on demand (Get). Apply keeps the index, and the views repair
// it from the stream (live.go says how).
//
// A View is subscribed before it is fed: every View.OnChange comes before the Log.Watch that
// feeds it, and OnChange afterwards panics with ErrSubscribedLate.
package eventlog
