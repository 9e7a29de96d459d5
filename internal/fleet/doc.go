// Package fleet builds the report `dynrunner status` prints of a deployment, split or not: every
// component process alive (the heartbeats of package liveness in eventlog.BucketComponents) and
// the live work (the assignments eventlog.BucketLive indexes, by phase and tier).
//
// Build is a pure function over what was read; Read reads it over NATS with nothing but read
// access (the NATS user dynrunner-status of deploy/nats/permissions.conf), and a controller
// builds the same report from its own view for its /status. Nothing here writes, and nothing
// here decides an assignment: heartbeats and records are read without the event log's key,
// for display, for the autoscaling advice (Decide: how many workers each tier wants, for
// GET /v1/fleet/autoscale (AutoscaleHandler), the dynrunner_autoscale_* gauges
// (AutoscaleCollector), KEDA and the built-in actuator), and for the scheduler's admission
// capacity under ADMIT_CAPACITY=workers (Capacity, followed by CapacityFollower).
package fleet
