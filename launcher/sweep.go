package launcher

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// stagingMaxAge is how old a staging directory without a lock file must be before Sweep
// removes it (a launcher creates the lock file right after the directory).
const stagingMaxAge = time.Minute

var tapNameRE = regexp.MustCompile(`^` + tapPrefix + `[0-9a-f]{8}$`)

// SweepResult counts what Sweep removed.
type SweepResult struct {
	Instances int // dead instance directories (and their TAP devices and hypervisors)
	Leases    int // address leases whose instance directory is gone
	TAPs      int // TAP devices labelled for a gone instance directory of this root
}

// Sweep removes what launchers that died without cleaning up (SIGKILL, a crash, a power loss)
// left under root: every instance directory whose launcher.pid is not locked by a live
// launcher is cleaned like Close does it (its hypervisor, still running despite the
// parent-death signal, is killed; its TAP device deleted; its address lease released; the
// directory removed), then leases of instances without a directory, then TAP devices labelled
// for an instance directory of root that no longer exists. Live instances are never touched.
// Sweep is safe to run concurrently with launchers and with other sweeps.
func Sweep(ctx context.Context, root string, log zerolog.Logger) error {
	_, err := SweepCount(ctx, root, log)
	return err
}

// SweepCount is Sweep, also reporting what it removed.
func SweepCount(ctx context.Context, root string, log zerolog.Logger) (SweepResult, error) {
	var res SweepResult
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("launcher: sweep %s: %w", root, err)
	}
	var errs []error
	for _, e := range entries {
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		name := e.Name()
		if strings.HasPrefix(name, stagingPrefix) && e.IsDir() {
			if removed, err := sweepStaging(filepath.Join(root, name)); err != nil {
				errs = append(errs, err)
			} else if removed {
				log.Info().Str("dir", name).Msg("removed a dead staging directory")
			}
			continue
		}
		id, err := ParseInstanceID(name)
		if err != nil || !e.IsDir() {
			continue
		}
		removed, err := sweepInstance(ctx, root, id)
		if err != nil {
			errs = append(errs, err)
			log.Warn().Err(err).Str(logKeyInstanceID, name).Msg("sweep: clean up a dead instance")
			continue
		}
		if removed {
			res.Instances++
			log.Info().Str(logKeyInstanceID, name).Msg("swept a dead instance")
		}
	}
	n, err := sweepLeases(root)
	res.Leases = n
	if err != nil {
		errs = append(errs, err)
	}
	n, err = sweepTAPs(ctx, root)
	res.TAPs = n
	if err != nil {
		errs = append(errs, err)
	}
	if res.Leases > 0 || res.TAPs > 0 {
		log.Info().Int("leases", res.Leases).Int("taps", res.TAPs).Msg("swept orphans")
	}
	return res, errors.Join(errs...)
}

// tryLock takes the flock of dir's launcher.pid without waiting. held reports that a live
// launcher holds it; exists that the file exists.
func tryLock(dir string) (f *os.File, held, exists bool, err error) {
	f, err = os.OpenFile(filepath.Join(dir, pidFile), os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, false, nil
	}
	if err != nil {
		return nil, false, true, err
	}
	if err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, true, true, nil
		}
		return nil, false, true, err
	}
	return f, false, true, nil
}

// sweepInstance cleans up instance id if no live launcher holds it.
func sweepInstance(ctx context.Context, root string, id InstanceID) (bool, error) {
	dir := filepath.Join(root, id.String())
	f, held, exists, err := tryLock(dir)
	if err != nil {
		return false, fmt.Errorf("launcher: sweep %s: %w", dir, err)
	}
	if held {
		return false, nil
	}
	if !exists {
		// Every instance directory is renamed into place with its lock file, so this one lost
		// it: a half-removed directory.
		fi, err := os.Lstat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return false, nil // removed meanwhile
		case err != nil:
			return false, fmt.Errorf("launcher: sweep %s: %w", dir, err)
		case !fi.IsDir():
			return false, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	if err := cleanupInstance(ctx, root, id, f); err != nil {
		return false, fmt.Errorf("launcher: sweep %s: %w", dir, err)
	}
	return true, nil
}

// sweepStaging removes a staging directory whose launcher died before renaming it into place.
func sweepStaging(dir string) (bool, error) {
	f, held, exists, err := tryLock(dir)
	if err != nil || held {
		return false, err
	}
	if !exists {
		// Its launcher may be between mkdir and creating the lock file: only an old one is dead.
		fi, err := os.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if time.Since(fi.ModTime()) < stagingMaxAge {
			return false, nil
		}
	}
	err = os.RemoveAll(dir)
	if f != nil {
		_ = f.Close()
	}
	return err == nil, err
}

// sweepLeases removes leases whose instance directory does not exist. A launcher creates its
// directory before its lease and removes its lease before its directory.
func sweepLeases(root string) (int, error) {
	dir := filepath.Join(root, leasesDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("launcher: sweep leases: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		id, ok := leaseOwner(p)
		if ok {
			if _, err := os.Lstat(filepath.Join(root, id.String())); !errors.Is(err, fs.ErrNotExist) {
				continue
			}
		} else if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < stagingMaxAge {
			continue // being written, or unreadable: leave it
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// sweepTAPs deletes TAP devices labelled for an instance directory of root that does not exist.
func sweepTAPs(ctx context.Context, root string) (int, error) {
	entries, err := os.ReadDir("/sys/class/net")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil // no sysfs: nothing to sweep
	}
	if err != nil {
		return 0, fmt.Errorf("launcher: sweep TAP devices: %w", err)
	}
	prefix := tapAliasPrefix + root + "/"
	n := 0
	var errs []error
	for _, e := range entries {
		tap := e.Name()
		if !tapNameRE.MatchString(tap) {
			continue
		}
		alias, ok := tapAlias(tap)
		if !ok || !strings.HasPrefix(alias, prefix) {
			continue
		}
		dir := strings.TrimPrefix(alias, tapAliasPrefix)
		id, err := ParseInstanceID(filepath.Base(dir))
		if err != nil || filepath.Dir(dir) != root || TAPName(id) != tap {
			continue
		}
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := deleteTAP(ctx, tap, alias); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
