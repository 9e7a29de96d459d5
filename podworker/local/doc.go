// Package local is the pod worker's "local" backend: each job's environment is the dynrunner
// executor running as a child process of the controller, for laptops and tests.
//
// # Layout
//
// Every environment lives in its own directory under Config.Root, named "<task>-<epoch>" and
// created with mode 0700 (with Config.Users: the controller's, group the environment's, mode
// 0710; see Users below):
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
//	<root>/.bin/<name>-<sha256>          with Config.Users: copies of the executor and of
//	                                     Config.Programs the environments' users can run
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
// /proc/<pid>/stat, in clock ticks since boot; it guards against PID reuse), "dir" (for humans;
// the backend always derives the directory from Root and ID) and, with Config.Users, "uid"
// (for humans too; the registry below is what the backend believes).
//
// The Backend that started a process reaps it and reports its exit code. A Backend that adopted
// one polls /proc until the process is gone, and reports the exit code only if the reaping
// controller recorded it in exit.json, else -1.
//
// Destroy sends SIGTERM to the process group, waits Config.Grace, then sends SIGKILL. It also
// signals every process whose initial environment carries this environment's DYNRUNNER_ENV_DIR
// (members that left the group with setsid, or a process whose handle was never written because
// the controller crashed in the middle of Start) and, with Config.Users, every process that
// runs as the environment's uid, then removes the directory without following symbolic links
// out of it and, last, gives up the uid.
//
// List reports every entry of Root except dot-entries. An entry without a valid handle.json (a
// crash in the middle of Start, or something that is not an environment) is reported as a Handle
// with ID set to the entry's name, Task and Epoch parsed from the name when it has the form
// "<task>-<epoch>" (else zero), and nil Data; the worker should Destroy it unless a live
// assignment owns it, and a retried Start of that assignment wipes and recreates it.
//
// # Users
//
// Without Config.Users the executor runs as the controller's user and is isolated from it only
// by its own directory and session: a job can read and signal anything that user can,
// Config.Root and every other environment included.
//
// With Config.Users (the controller must be root) each environment runs under a uid of its own
// from the range, with the gid of the same number and no supplementary groups:
//
//   - Start claims the lowest uid of the range that no environment holds and no process runs
//     as (real, effective, saved or file-system uid), and records the claim in the registry,
//     Users.Registry (a directory of root's, mode 0700): a file named after the uid that holds
//     the environment's directory. Claims are made under the registry's flock(2), so the
//     environments of every Backend of the host that shares the registry get distinct uids,
//     after restarts too. A claim whose directory is gone and whose uid runs nothing (a crash)
//     is taken over.
//   - secrets/ (and its files, 0600), work/, home/ and tmp/ belong to the uid; the
//     environment's directory stays root's with the uid's group and mode 0710, so the
//     environment can neither change handle.json nor read executor.log, and other uids cannot
//     enter it. The root is made 0711: environments pass through it but cannot list it.
//   - Every directory above the root must be searchable by other users (o+x); New checks
//     that, and that the range is mapped in the controller's user namespace.
//   - The executor and Config.Programs are copied into <root>/.bin (0711; copies 0555, root's)
//     because their own directories may not let the environments' users in.
//   - Destroy kills every process of the uid, including those that left the process group and
//     cleared their environment, and gives the uid up only once the directory is gone.
//
// An environment can then read neither the controller's files (the root's other entries, the
// keys and passwords next to it) nor another environment's, nor signal their processes. It
// still shares the host's network, /tmp and everything the host lets any user read.
//
// The package needs Linux's /proc; elsewhere New fails.
package local
