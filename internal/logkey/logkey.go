// Package logkey holds the stable field names of dynrunner's structured logs, so operators can
// query them across components and releases.
package logkey

// Field names.
const (
	Component = "component"
	TaskID    = "task_id"
	Epoch     = "epoch"
	Backend   = "backend"
	Env       = "env"
	Phase     = "phase"
	SpiffeID  = "spiffe_id"
	PodUID    = "pod_uid"
)
