package launcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Names inside an instance directory.
const (
	pidFile       = "launcher.pid"
	diskFile      = "disk.qcow2"
	seedFile      = "seed.iso"
	serialFile    = "serial.log"
	apiSocketFile = "ch.sock"
	hvLogFile     = "hypervisor.log"
	stagingPrefix = ".new-"
)

// Log field names.
const (
	logKeyInstanceID = "instance_id"
	logKeyHypervisor = "hypervisor"
	logKeyTAP        = "tap"
	logKeyIP         = "ip"
	logKeyPhase      = "phase"
)

// Timings are the durations of Prepare's steps.
type Timings struct {
	Disk    time.Duration // O_DIRECT probes, qemu-img convert and resize
	Seed    time.Duration // address lease and seed ISO
	Network time.Duration // bridge check and TAP device
	Total   time.Duration // all of Prepare, the instance directory included
}

// Instance is one prepared VM: its directory, disk, seed, address lease and TAP device. Run
// boots it; Close removes everything. An Instance holds the flock of its directory's
// launcher.pid from Prepare to Close, which tells a Sweep that the instance is alive.
type Instance struct {
	cfg     Config
	hv      Hypervisor
	log     zerolog.Logger
	dir     string
	lock    *os.File
	ip      netip.Addr
	tap     string
	timings Timings

	closeOnce sync.Once
	closeErr  error
}

// Dir returns the instance directory, <root>/<instance-id>.
func (i *Instance) Dir() string { return i.dir }

// IP returns the guest's address.
func (i *Instance) IP() netip.Addr { return i.ip }

// TAP returns the name of the TAP device.
func (i *Instance) TAP() string { return i.tap }

// SerialLog returns the path of the guest's serial console log (inside Dir, so gone after
// Close; see Config.ConsoleLog).
func (i *Instance) SerialLog() string { return filepath.Join(i.dir, serialFile) }

// Timings returns how long Prepare's steps took.
func (i *Instance) Timings() Timings { return i.timings }

// Spec returns the VMSpec the hypervisor runs.
func (i *Instance) Spec() VMSpec {
	return VMSpec{
		Dir:       i.dir,
		Disk:      filepath.Join(i.dir, diskFile),
		Seed:      filepath.Join(i.dir, seedFile),
		Serial:    filepath.Join(i.dir, serialFile),
		APISocket: filepath.Join(i.dir, apiSocketFile),
		TAP:       i.tap,
		MAC:       MAC(i.cfg.InstanceID),
		CPUs:      i.cfg.CPUs,
		MemoryMiB: i.cfg.MemoryMiB,
		Kernel:    i.cfg.Kernel,
		Initramfs: i.cfg.Initramfs,
		Cmdline:   i.cfg.Cmdline,
		Firmware:  i.cfg.Firmware,
	}
}

// Prepare validates cfg and creates everything the VM needs, in <root>/<instance-id>/: the
// locked launcher.pid, the flat qcow2 root disk (converted with direct I/O), the NoCloud seed
// ISO, an address lease in <root>/.ips/, and the TAP device on the bridge (creating the bridge
// when needed). On error it removes whatever it created. An instance directory that exists
// already is refused with ErrInstanceExists (run Sweep first to clear dead ones).
func Prepare(ctx context.Context, cfg Config, log zerolog.Logger) (_ *Instance, err error) {
	t0 := time.Now()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hv, err := NewHypervisor(cfg.Hypervisor)
	if err != nil {
		return nil, err
	}
	i := &Instance{
		cfg: cfg,
		hv:  hv,
		log: log.With().Str(logKeyInstanceID, cfg.InstanceID.String()).Str(logKeyHypervisor, hv.Name()).Logger(),
		tap: TAPName(cfg.InstanceID),
	}
	if err := os.MkdirAll(cfg.Root, 0o700); err != nil {
		return nil, fmt.Errorf("launcher: root: %w", err)
	}
	if err := i.createDir(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if cerr := i.Close(); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}()

	step := time.Now()
	i.log.Debug().Str(logKeyPhase, "disk").Msg("converting the root disk")
	if err := probeDirectIO(i.dir); err != nil {
		return nil, err
	}
	if err := probeImageDirectIO(cfg.Image); err != nil {
		return nil, err
	}
	if err := convertDisk(ctx, cfg.Image, filepath.Join(i.dir, diskFile), cfg.DiskGiB); err != nil {
		return nil, err
	}
	i.timings.Disk = time.Since(step)

	step = time.Now()
	if i.ip, err = allocateIP(cfg.Root, cfg.InstanceID, cfg.BridgeCIDR, cfg.Endpoint.Addr.Addr()); err != nil {
		return nil, err
	}
	seed := seedData{
		ID:       cfg.InstanceID,
		Nonce:    cfg.Nonce,
		Endpoint: cfg.Endpoint,
		MAC:      MAC(cfg.InstanceID),
		Addr:     netip.PrefixFrom(i.ip, cfg.BridgeCIDR.Bits()),
		Gateway:  cfg.BridgeCIDR.Addr(),
		DNS:      cfg.DNS,
	}
	if err := writeSeed(ctx, i.dir, filepath.Join(i.dir, seedFile), seed); err != nil {
		return nil, err
	}
	i.timings.Seed = time.Since(step)

	step = time.Now()
	if err := ensureBridge(ctx, cfg.Root, cfg.Bridge, cfg.BridgeCIDR); err != nil {
		return nil, err
	}
	if err := createTAP(ctx, i.tap, i.tapAlias(), cfg.Bridge); err != nil {
		return nil, err
	}
	i.timings.Network = time.Since(step)
	i.timings.Total = time.Since(t0)
	i.log.Info().Str(logKeyTAP, i.tap).Stringer(logKeyIP, i.ip).Str("mac", MAC(cfg.InstanceID).String()).
		Dur("disk", i.timings.Disk).Dur("seed", i.timings.Seed).Dur("network", i.timings.Network).
		Dur("total", i.timings.Total).Msg("instance prepared")
	return i, nil
}

func (i *Instance) tapAlias() string { return tapAliasPrefix + i.dir }

// createDir creates <root>/<id> holding a locked launcher.pid. It builds the directory under a
// staging name and renames it into place, so that a Sweep never sees the instance directory
// without its lock held.
func (i *Instance) createDir() error {
	root, id := i.cfg.Root, i.cfg.InstanceID.String()
	i.dir = filepath.Join(root, id)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	stage := filepath.Join(root, stagingPrefix+id+"-"+hex.EncodeToString(rnd[:]))
	if err := os.Mkdir(stage, 0o700); err != nil {
		return fmt.Errorf("launcher: instance directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(stage, pidFile), os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err == nil {
		if err = flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			_, err = f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
		}
		if err != nil {
			_ = f.Close()
		}
	}
	if err == nil {
		err = os.Rename(stage, i.dir)
		if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
			err = fmt.Errorf("%s: %w", i.dir, ErrInstanceExists)
		}
		if err != nil {
			_ = f.Close()
		}
	}
	if err != nil {
		_ = os.RemoveAll(stage)
		return fmt.Errorf("launcher: instance directory: %w", err)
	}
	i.lock = f
	return nil
}

// Close kills the hypervisor if it still runs, deletes the TAP device, releases the address
// lease and removes the instance directory (disk, seed, sockets, logs), copying the serial log
// to Config.ConsoleLog first when set. It is idempotent. When something cannot be removed, the
// directory stays (its lock released) for the next Sweep.
func (i *Instance) Close() error {
	i.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if i.cfg.ConsoleLog != "" {
			if err := copyFile(filepath.Join(i.dir, serialFile), i.cfg.ConsoleLog); err != nil && !errors.Is(err, fs.ErrNotExist) {
				i.log.Warn().Err(err).Msg("copy the serial console log")
			}
		}
		i.closeErr = cleanupInstance(ctx, i.cfg.Root, i.cfg.InstanceID, i.lock)
		i.lock = nil
		if i.closeErr == nil {
			i.log.Info().Msg("instance removed")
		}
	})
	return i.closeErr
}

// cleanupTimeout bounds Close and the cleanup of one dead instance by Sweep.
const cleanupTimeout = 30 * time.Second

// cleanupInstance removes instance id under root: stragglers of its hypervisor, its TAP
// device, its leases and its directory. lock is the instance's locked launcher.pid, closed at
// the end (nil when there is none).
func cleanupInstance(ctx context.Context, root string, id InstanceID, lock *os.File) error {
	dir := filepath.Join(root, id.String())
	var errs []error
	if _, err := killStragglers(ctx, dir+"/", 10*time.Second); err != nil {
		errs = append(errs, err)
	}
	if err := deleteTAP(ctx, TAPName(id), tapAliasPrefix+dir); err != nil {
		errs = append(errs, err)
	}
	if err := releaseIPs(root, id); err != nil {
		errs = append(errs, fmt.Errorf("launcher: release address: %w", err))
	}
	if len(errs) == 0 {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("launcher: remove %s: %w", dir, err))
		}
	}
	if lock != nil {
		_ = lock.Close()
	}
	return errors.Join(errs...)
}

// copyFile copies src to dst (created or truncated, mode 0600).
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	return out.Close()
}
