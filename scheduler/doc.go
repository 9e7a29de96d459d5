// Package scheduler is dynrunner's resident forge runner.
//
// The Scheduler acts as one runner on the forge (a forge.Forge, already registered): it
// fetches tasks, routes each by its `runs-on` labels to the pod or vm backend, persists the
// complete assignment to JetStream before anything else, dispatches it, keeps the upstream
// task alive while the environment boots, and reconciles: it fails assignments whose pickup
// deadline or lease passed, reports failures upstream, and drops the sealed tasks of ended
// assignments.
package scheduler
