package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/forge/github/githubtest"
	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/launcher"
)

// TestGitHubJobsRunInVMs: a job queued in GitHub for [self-hosted, vm] gets a slot of the vm
// scale set, whose microVM (the Debian guest image, with the stand-in runner as GitHub's
// runner at /opt/actions-runner, booted under QEMU) redeems its nonce for the slot's JIT
// configuration and runs the runner of its image, which takes the job from GitHub and reports
// it there; JobStarted and JobCompleted are recorded on the slot, and the VM (launcher, QEMU,
// TAP device, directory) and the runner at GitHub are gone afterwards.
func TestGitHubJobsRunInVMs(t *testing.T) {
	runnerDir, runnerSHA := guestStandInRunnerDir(t)
	b, launchers, bridge := startGitHubVMBed(t, runnerDir, runnerSHA)
	srv := b.srv

	job, err := srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "vm"}, Repository: "app", DisplayName: "inside",
		Run: `echo "hello from $GITHUB_REPOSITORY on $RUNNER_NAME as $(id -un)"; grep -m1 'model name' /proc/cpuinfo; ` +
			`test -z "${ACTIONS_RUNNER_INPUT_JITCONFIG:-}" && echo "no JIT configuration in the job"`})
	require.NoError(t, err)
	began := time.Now()
	j := b.waitJob(t, job, 10*time.Minute)
	t.Logf("the job ran in a microVM in %s", time.Since(began).Round(time.Second))
	log, err := srv.JobLog(job)
	require.NoError(t, err)
	require.Equal(t, "succeeded", j.Result, "job log:\n%s", log)
	assert.Contains(t, log, "hello from octo/app on dynrunner-vm-")
	assert.Contains(t, log, " as runner\n", "the job did not run as the guest image's runner user")
	assert.Contains(t, log, "QEMU", "the job did not run in the microVM")
	assert.Contains(t, log, "no JIT configuration in the job")

	require.Eventually(t, func() bool {
		for _, tr := range transitions(b.slotRecords(t)) {
			if tr[assignment.Completed] == 1 {
				return true
			}
		}
		return false
	}, time.Minute, time.Second, "the slot was not completed")
	recs := b.slotRecords(t)
	for task, tr := range transitions(recs) {
		for _, want := range slotLifecycle {
			assert.Equal(t, 1, tr[want], "slot %d: %s records", task, want)
		}
	}
	for _, r := range recs {
		assert.Equal(t, assignment.BackendVM, r.Backend, "slot %d on the %s tier", r.Task, r.Backend)
	}

	// Nothing of the VM remains: no launcher, no qemu, no TAP device, no per-VM directory; and no
	// runner at GitHub.
	require.Eventually(t, func() bool { return vmLeftovers(launchers, bridge) == "" }, time.Minute, 250*time.Millisecond,
		"left behind after the VM job: %s", vmLeftovers(launchers, bridge))
	assertNoEnvironmentsLeft(t, b.c)
	require.Eventually(t, func() bool { return len(srv.Runners()) == 0 }, time.Minute, 200*time.Millisecond,
		"runners left at GitHub: %+v", srv.Runners())
}

// startGitHubVMBed starts a controller serving the pod and vm scale sets of a fake GitHub, its
// vm tier booting the Debian guest image, with the runner of runnerDir as GitHub's runner
// (GITHUB_RUNNER_DIR) under GITHUB_VM_RUNNER_SHA256=runnerSHA, under QEMU; it returns once
// both scale sets' sessions are open, with the launchers' root and the bridge.
func startGitHubVMBed(t *testing.T, runnerDir, runnerSHA string) (b *gitHubBed, launchers, bridge string) {
	t.Helper()
	tools := needTools(t)
	needVMTools(t)
	const cidr = "10.213.81.1/24"
	bridge = "drgh0"
	bridgeAddr := netip.MustParsePrefix(cidr)
	// The fake GitHub listens where guests reach it, the bridge's address, so the bridge is made
	// before the controller's launchers would make it (they take it as it is); vmEnv removes
	// it. The controller reaches the same fake on loopback: GITHUB_CONFIG_URL is https, or
	// http on loopback only.
	require.NoError(t, launcher.EnsureBridge(t.Context(), t.TempDir(), bridge, bridgeAddr))
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", bridge).Run() })
	guests, err := net.Listen("tcp4", net.JoinHostPort(bridgeAddr.Addr().String(), "0"))
	require.NoError(t, err)
	loop, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	srv := githubtest.New(t, githubtest.Options{Tokens: []string{"ghp_e2e"}, LongPollTimeout: time.Second, AssignOnAcquire: true,
		SessionTimeout: 5 * time.Second, Listener: joinListeners(guests, loop)})

	img := buildImage(t, "../deploy/vm-image/build.sh", "GITHUB_RUNNER_DIR="+runnerDir)
	f := startForge(t, tools)
	token := filepath.Join(t.TempDir(), "github-token")
	require.NoError(t, secretfile.WriteNew(token, []byte("ghp_e2e")))
	vm := vmEnv(t, img, bridge, cidr, "VM_EGRESS=nat", "VM_EGRESS_ALLOW="+guests.Addr().String())
	env := append([]string{leaseEnv, pickupEnv, gitHubLeasesEnv,
		"GITHUB_CONFIG_URL=http://" + loop.Addr().String() + "/acme", "GITHUB_TOKEN_FILE=" + token, "GITHUB_IDLE_SECS=300",
		"GITHUB_VM_RUNNER_SHA256=" + runnerSHA,
	}, gitHubWorkerEnv(t)...)
	c := newController(t, tools, f, "", append(env, vm...)...)
	for _, kv := range vm {
		if v, ok := strings.CutPrefix(kv, "VM_LAUNCHER_ROOT="); ok {
			launchers = v
		}
	}
	c.start()
	b = &gitHubBed{srv: srv, c: c}

	require.Eventually(t, func() bool {
		names := map[string]bool{}
		for _, s := range srv.ScaleSets() {
			names[s.Name] = true
		}
		return names["dynrunner-pod"] && names["dynrunner-vm"] && len(srv.Sessions()) == 2
	}, 60*time.Second, 100*time.Millisecond, "the controller did not make the pod and vm scale sets and open their sessions")
	return b, launchers, bridge
}

// TestGitHubVMSlotFailsWithItsGuest: a slot whose guest fails before its runner runs (here:
// run.sh does not match GITHUB_VM_RUNNER_SHA256) fails when its VM powers off, with the
// guest's own error in the failed record, not only when GITHUB_IDLE_SECS passes with a reason
// that does not say why; its VM and its runner at GitHub are gone afterwards.
func TestGitHubVMSlotFailsWithItsGuest(t *testing.T) {
	runnerDir, _ := guestStandInRunnerDir(t)
	b, launchers, bridge := startGitHubVMBed(t, runnerDir, strings.Repeat("ab", 32))
	job, err := b.srv.QueueJob(githubtest.JobSpec{Labels: []string{"self-hosted", "vm"}, Repository: "app", Run: "true"})
	require.NoError(t, err)
	began := time.Now()
	var failed assignment.State
	require.Eventually(t, func() bool {
		for _, r := range b.slotRecords(t) {
			if r.Transition == assignment.Failed {
				failed = r
				return true
			}
		}
		return false
	}, 4*time.Minute, time.Second, "no slot failed")
	t.Logf("the slot failed %s after the job was queued: %s", time.Since(began).Round(time.Second), failed.Reason)
	assert.Contains(t, failed.Reason, "exit code 6", "the launcher did not pass the guest's failure on")
	assert.Contains(t, failed.Reason, "guest failed: ", "the failed record does not carry the guest's error")
	assert.Contains(t, failed.Reason, "does not match the pinned version", "the failed record does not say what the guest refused")
	assert.NotContains(t, failed.Reason, "GITHUB_IDLE_SECS")

	// The job is still assigned, so the scale set makes it another slot, whose guest fails the
	// same way; cancelled, it needs none, and every slot of it ends with its VM and runner.
	require.NoError(t, b.srv.CompleteJob(job, "canceled"))
	require.Eventually(t, func() bool {
		for _, tr := range transitions(b.slotRecords(t)) {
			if tr[assignment.Closed] == 0 && tr[assignment.Completed] == 0 {
				return false
			}
		}
		return len(b.srv.Runners()) == 0
	}, 3*time.Minute, time.Second, "slots did not end after the job was cancelled; runners at GitHub: %+v", b.srv.Runners())
	require.Eventually(t, func() bool { return vmLeftovers(launchers, bridge) == "" }, time.Minute, 250*time.Millisecond,
		"left behind after the VM failed: %s", vmLeftovers(launchers, bridge))
	assertNoEnvironmentsLeft(t, b.c)
}

// guestStandInRunnerDir makes the directory the guest image gets as GitHub's runner
// (GITHUB_RUNNER_DIR): the stand-in runner, built static, and a run.sh that runs it, as the
// real runner's run.sh runs its listener. It returns the directory and run.sh's SHA-256.
func guestStandInRunnerDir(t *testing.T) (dir, sha string) {
	t.Helper()
	dir = t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "bin", "standinrunner"), githubtest.StandInRunnerPackage)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build the stand-in runner:\n%s", out)
	run := []byte("#!/bin/sh\n# GitHub's run.sh, stood in for by githubtest's stand-in runner (tests only).\nexec /opt/actions-runner/bin/standinrunner \"$@\"\n")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run.sh"), run, 0o755))
	sum := sha256.Sum256(run)
	return dir, hex.EncodeToString(sum[:])
}

// joinedListener accepts the connections of several listeners; its address is the first's.
type joinedListener struct {
	lns   []net.Listener
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

// joinListeners returns a listener accepting on every one of lns, named by the first: a server
// that hands out its own URL (the fake GitHub) names that one, and is reached on all.
func joinListeners(lns ...net.Listener) net.Listener {
	j := &joinedListener{lns: lns, conns: make(chan net.Conn), done: make(chan struct{})}
	for _, ln := range lns {
		j.wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				select {
				case j.conns <- c:
				case <-j.done:
					c.Close()
					return
				}
			}
		})
	}
	return j
}

func (j *joinedListener) Accept() (net.Conn, error) {
	select {
	case c := <-j.conns:
		return c, nil
	case <-j.done:
		return nil, net.ErrClosed
	}
}

func (j *joinedListener) Close() error {
	var errs []error
	j.once.Do(func() {
		close(j.done)
		for _, ln := range j.lns {
			errs = append(errs, ln.Close())
		}
		j.wg.Wait()
	})
	return errors.Join(errs...)
}

func (j *joinedListener) Addr() net.Addr { return j.lns[0].Addr() }
