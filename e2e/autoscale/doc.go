// Package autoscale tests the built-in actuator (AUTOSCALE=docker) on a split deployment of
// internal/testbed/fleetbed: a scheduler that starts and drains pod-worker containers on the
// Docker engine while real Gitea jobs queue and end.
package autoscale
