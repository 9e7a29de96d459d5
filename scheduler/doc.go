// Package scheduler is dynrunner's resident forge runner.
//
// The Scheduler acts as one runner on the forge (a forge.Forge, already registered): it
// fetches tasks, routes each by its `runs-on` labels to the pod or vm backend, persists the
// complete assignment to JetStream before anything else, dispatches it, keeps the upstream
// task alive while the environment boots, and reconciles: it fails assignments whose pickup
// deadline or lease passed, reports failures upstream, and drops the sealed tasks of ended
// assignments.
//
// Any number of Schedulers may run against one event log as one forge runner. Every one
// fetches and claims (a claim is a compare-and-swap append, its sealed task a KV create, so a
// task has one owner). Only the holder of the reconcile lease (a lease.Lease, key LeaseReconcile in
// eventlog.BucketLeases) reconciles; it reconciles under a context that ends with its belief in
// the lease, and claims each failure report with a `reporting` append before it calls the
// forge, so a holder that paused past its lease reports nothing its successor reports.
package scheduler

// LeaseReconcile is the key of the reconcile lease in eventlog.BucketLeases: the one scheduler
// replica that holds it runs the reconcile loop (deadlines, failure reports, keepalives,
// redispatch, dropping sealed tasks). Every replica fetches and claims tasks.
const LeaseReconcile = "reconcile"
