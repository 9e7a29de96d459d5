// Package podworker is dynrunner's pod worker: the durable consumer of pod assignments. For
// each dispatch it records the transition, issues the environment's single-use capability
// token and identity, starts one environment through a Backend (local processes, Docker
// containers or Kubernetes Pods), records its handle, watches it, and destroys it when the job
// ends. After a restart it adopts the environments live assignments own and reaps the rest.
package podworker
