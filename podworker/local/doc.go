// Package local is the pod worker's "local" backend: each job's environment is the dynrunner
// executor running as a child process of the controller, for laptops and tests.
//
// # Layout
//
// Every environment lives in its own directory under Config.Root, named "<task>-<epoch>" and
// created with mode 0700:
//
//	<root>/<task>-<epoch>/handle.json    the podworker.Handle, written atomically after the start
//	<root>/<task>-<epoch>/executor.log   the executor's stdout and stderr (a file, never a pipe)
//	<root>/<task>-<epoch>/exit.json      the exit status, written by the controller that reaped it
//	<root>/<task>-<epoch>/secrets/       Spec.Files, mode 0600 each (DYNRUNNER_SECRETS_DIR)
//	<root>/<task>-<epoch>/work/          the executor's working directory (DYNRUNNER_WORK_DIR)
//	<root>/<task>-<epoch>/home/          HOME
//	<root>/<task>-<epoch>/tmp/           TMPDIR
//	<root>/.locks/<task>-<epoch>         flock(2) file serialising Start and Destroy of one
//	                                     environment across goroutines and processes
//
// The executor's environment is exactly Config.BaseEnv, then Spec.Env, then DYNRUNNER_ENV_DIR,
// DYNRUNNER_SECRETS_DIR, DYNRUNNER_WORK_DIR, HOME and TMPDIR (later entries win). Nothing is
// inherited from the controller's own environment.
//
// # Processes
//
// The executor starts in a new session (setsid(2)), so it leads its own process group (pgid ==
// pid) and has no controlling terminal. It has no parent-death signal: an environment keeps
// running when the controller crashes or restarts, and a new Backend over the same Root adopts it
// through List, Wait and Destroy.
//
// Handle.ID is the directory name. Handle.Data holds "pid", "pgid", "start_time" (field 22 of
// /proc/<pid>/stat, in clock ticks since boot; it guards against PID reuse) and "dir" (for humans;
// the backend always derives the directory from Root and ID).
//
// The Backend that started a process reaps it and reports its exit code. A Backend that adopted
// one polls /proc until the process is gone, and reports the exit code only if the reaping
// controller recorded it in exit.json, else -1.
//
// Destroy sends SIGTERM to the process group, waits Config.Grace, then sends SIGKILL. It also
// signals every process whose initial environment carries this environment's DYNRUNNER_ENV_DIR
// (members that left the group with setsid, or a process whose handle was never written because
// the controller crashed in the middle of Start), then removes the directory without following
// symbolic links out of it.
//
// List reports every entry of Root except dot-entries. An entry without a valid handle.json (a
// crash in the middle of Start, or something that is not an environment) is reported as a Handle
// with ID set to the entry's name, Task and Epoch parsed from the name when it has the form
// "<task>-<epoch>" (else zero), and nil Data; the worker should Destroy it unless a live
// assignment owns it, and a retried Start of that assignment wipes and recreates it.
//
// The executor runs as the controller's user and is isolated from it only by its own directory
// and session: a job can read and signal anything that user can. Use the docker or kubernetes
// backend for jobs that are not trusted.
//
// The package needs Linux's /proc; elsewhere New fails.
package local
