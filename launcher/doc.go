// Package launcher is microvm-runner-launch: it runs one single-use VM for one job and removes
// everything it created when the VM ends. It is used by the vm worker, which runs
// `dynrunner launcher` as a child process (in its own process group; Destroy sends SIGTERM to
// the group, then SIGKILL), and stands alone for operators and tests.
//
// # Input
//
// Config, from flags or their DYNRUNNER_LAUNCH_* environment variables (ParseFlags). Only a
// UUID instance id in canonical lowercase form, a nonce of 16-128 URL-safe base64 characters,
// an http://<ip>:<port> endpoint on the bridge network and absolute, clean paths of
// [A-Za-z0-9._/+@-] are accepted. Nothing ever goes through a shell: every program runs from an
// argv with an environment of its own (PATH and LC_ALL only), so the nonce in the launcher's
// environment reaches no child.
//
// # Layout
//
// Everything of one instance lives in its own directory, mode 0700:
//
//	<root>/<instance-id>/launcher.pid    the launcher's pid, flock(2)ed while it lives
//	<root>/<instance-id>/disk.qcow2      flat qcow2 root disk, converted from --image with
//	                                     direct I/O (qemu-img convert -t none -T none) and
//	                                     grown to --disk-gib
//	<root>/<instance-id>/seed.iso        NoCloud seed (volume cidata): meta-data, user-data,
//	                                     network-config; the nonce, never a token
//	<root>/<instance-id>/serial.log      the guest's serial console
//	<root>/<instance-id>/hypervisor.log  the hypervisor's stdout and stderr
//	<root>/<instance-id>/ch.sock         Cloud Hypervisor's API socket
//	<root>/.ips/<ip>                     address lease (O_EXCL), holding the instance id
//	<root>/.bridge.lock                  serialises the bridge setup
//	<root>/.new-<instance-id>-<random>/  staging name of an instance directory being created
//
// # Network
//
// The bridge (--bridge, default dynrunner0) is created when missing and given --bridge-cidr's
// address (default 10.213.0.1/24); the launcher never removes it and sets up no NAT or
// forwarding. Each guest gets a TAP device dr<first 8 hex digits of the id> on the bridge
// (labelled with the ifalias "dynrunner-launcher <instance dir>"), a MAC derived from the
// instance id (MAC, locally administered) and a static address from the bridge network with
// the default route via the bridge address, both in network-config.
//
// # Lifetime
//
// Prepare creates the instance, Run boots it and waits, Close removes it; Launch does all three
// after a Sweep. The hypervisor runs in its own process group with a parent-death signal of
// SIGKILL, so a SIGKILLed launcher takes it along; what such a launcher leaves behind (TAP
// device, files, lease) is removed by the next Sweep, which tells dead instances from live ones
// by the flock on launcher.pid.
//
// Run returns nil only when the guest powered off by itself (the hypervisor exited with status
// 0; QEMU runs with -no-reboot, so a guest reboot counts as a power-off) and `dynrunner guest`
// did not say it failed, ErrGuestFailed when it did (the last GuestMarker line on the serial
// console, as the process backends pass on the executor's exit code), ErrDeadline when
// Config.Deadline killed the VM, ErrStopped when the launcher was stopped, and
// ErrHypervisorFailed otherwise. ExitCode maps them to the command's exit codes 0, 6, 3, 4, 5;
// invalid input is 2 and any other failure 1.
package launcher
