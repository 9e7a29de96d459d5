// Package liveness keeps one heartbeat per running component process in the components bucket
// (eventlog.BucketComponents), so that `dynrunner status` can list a split deployment's fleet
// from NATS alone.
//
// A Heartbeat puts its Record under <kind>.<instance> at once and then every third of the
// bucket's TTL (LIVENESS_TTL), refreshing what its kind reports (a worker's environments in
// flight, whether a scheduler holds the reconcile lease). A process that stops deletes its key;
// one that is killed stops beating and its key expires with the bucket's TTL. A record is a
// claim of liveness, never an input to a decision: nothing but the fleet report reads it.
package liveness
