// Package autoscale is dynrunner's built-in actuator (AUTOSCALE=docker): it grows and shrinks
// the pod workers on one Docker engine to the autoscaling decision (fleet.Decide), within
// AUTOSCALE_MIN and AUTOSCALE_MAX and throttled by AUTOSCALE_COOLDOWN.
//
// It scales in only through drain: a surplus worker is cordoned (the same cordon `dynrunner
// drain` writes), finishes the environments it has, and its container is removed only once its
// own heartbeat says it drains with nothing in flight. A worker with work is never removed.
//
// What to do is decided by [Plan], a pure function of the decision, the containers and the
// workers' heartbeats and cordons; [Actuator] reads those, runs the plan on the engine and in
// JetStream, and runs only in the scheduler that holds the reconcile lease, so that replicas
// never scale against each other.
package autoscale
