//go:build linux

// Package procfs reads the Linux process table from /proc: each process's stat line (command
// name, state, process group, start time), its arguments and its initial environment. The
// launcher finds its stray hypervisors with it, the local pod backend the processes of an
// environment.
package procfs
