// Package liveness keeps one heartbeat per running component process in the components bucket
// (eventlog.BucketComponents), so that `dynrunner status` can list a split deployment's fleet
// from NATS alone.
//
// A Heartbeat puts its Record under <kind>.<instance> at once and then every third of the
// bucket's TTL (LIVENESS_TTL), refreshing what its kind reports (a worker's environments in
// flight, whether a scheduler holds the reconcile lease). A process that stops deletes its key;
// one that is killed stops beating and its key expires with the bucket's TTL. A record is a
// claim of liveness, never an input to an assignment's decision: the fleet report, the
// autoscaling advice and a drain's safe_to_remove read it. Cordons (Cordon, in
// eventlog.BucketCordons) tell a worker to drain: DrainHandler serves the drain API
// (/v1/workers/{id}) that puts and lifts them, and CordonSweeper removes those of workers that
// are gone (the pure StaleCordons decides which).
package liveness
