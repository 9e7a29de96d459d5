package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/dynrunner/dynrunner/internal/envlock"
)

// DefaultRegistry is where the Backends of a host record which environment holds which uid,
// when Users.Registry is empty.
const DefaultRegistry = "/run/dynrunner/local-uids"

// Users runs each environment under a user id of its own (see the package documentation).
type Users struct {
	// First is the first uid of the range and Count its size. An environment runs as one uid
	// of the range, with the group of the same number and no supplementary groups.
	First, Count uint32
	// Registry is the directory in which the Backends of a host record which environment
	// holds which uid; DefaultRegistry when empty. Backends whose ranges overlap must share
	// it.
	Registry string
}

// ErrNoFreeUID reports that every uid of Users' range is held by an environment or used by a
// process: Start cannot run another environment until one is destroyed.
var ErrNoFreeUID = errors.New("local: no free uid in the range")

// noUID stands for "the environment has no uid of its own".
const noUID = -1

// checkUsers validates u for New and returns it with its defaults filled in.
func checkUsers(u Users) (Users, error) {
	if u.Registry == "" {
		u.Registry = DefaultRegistry
	}
	if !filepath.IsAbs(u.Registry) {
		return u, fmt.Errorf("local: uid registry %q is not an absolute path", u.Registry)
	}
	u.Registry = filepath.Clean(u.Registry)
	last := uint64(u.First) + uint64(u.Count) - 1
	if u.First == 0 || u.Count == 0 || last >= math.MaxUint32 {
		return u, fmt.Errorf("local: uid range %d+%d: want uids from 1 to %d", u.First, u.Count, uint32(math.MaxUint32-1))
	}
	if euid := os.Geteuid(); euid != 0 {
		return u, fmt.Errorf("local: running environments under uids of their own needs root; the controller runs as uid %d", euid)
	}
	for _, m := range []string{"/proc/self/uid_map", "/proc/self/gid_map"} {
		ok, err := idsMapped(m, u.First, u.Count)
		if err != nil {
			return u, fmt.Errorf("local: %w", err)
		}
		if !ok {
			return u, fmt.Errorf("local: ids %d to %d are not all mapped in this user namespace (%s): pick a range that is", u.First, last, m)
		}
	}
	if err := os.MkdirAll(u.Registry, 0o700); err != nil {
		return u, fmt.Errorf("local: uid registry: %w", err)
	}
	fi, err := os.Lstat(u.Registry)
	if err != nil {
		return u, fmt.Errorf("local: uid registry: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !fi.IsDir() || !ok || st.Uid != 0 || fi.Mode().Perm()&0o077 != 0 {
		return u, fmt.Errorf("local: uid registry %s must be a directory of root's with mode 0700, is %v", u.Registry, fi.Mode())
	}
	return u, nil
}

// idsMapped reports whether the ids first to first+count-1 are all mapped in the user
// namespace map file path (/proc/self/uid_map or gid_map).
func idsMapped(path string, first, count uint32) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	next, end := uint64(first), uint64(first)+uint64(count)
	type extent struct{ from, to uint64 }
	var extents []extent
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 {
			return false, fmt.Errorf("%s: malformed line %q", path, sc.Text())
		}
		in, err1 := strconv.ParseUint(fields[0], 10, 32)
		n, err2 := strconv.ParseUint(fields[2], 10, 32)
		if err1 != nil || err2 != nil {
			return false, fmt.Errorf("%s: malformed line %q", path, sc.Text())
		}
		extents = append(extents, extent{in, in + n})
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	// Extents do not overlap; walk forward from first as long as one covers the next id.
	for progress := true; progress && next < end; {
		progress = false
		for _, e := range extents {
			if e.from <= next && next < e.to {
				next, progress = e.to, true
			}
		}
	}
	return next >= end, nil
}

// checkReachable checks that every directory above root lets other users through (o+x), so
// that the environments' users reach their directories.
func checkReachable(root string) error {
	for d := filepath.Dir(root); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("local: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("local: %s has mode %04o, so the environments' users cannot reach %s: every directory above it must be searchable by other users (chmod o+x), or the root must move", d, fi.Mode().Perm(), root)
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

// lockUIDs takes the registry's lock; claims, look-ups and releases take turns under it.
func (b *Backend) lockUIDs(ctx context.Context) (func(), error) {
	unlock, err := envlock.Lock(ctx, b.users.Registry, ".lock")
	if err != nil {
		return nil, fmt.Errorf("uid registry: %w", err)
	}
	return func() { unlock(false) }, nil
}

// registry reads the registry: the environment directory each claimed uid belongs to. The
// caller holds the registry's lock.
func (b *Backend) registry() (map[uint32]string, error) {
	entries, err := os.ReadDir(b.users.Registry)
	if err != nil {
		return nil, fmt.Errorf("uid registry: %w", err)
	}
	out := make(map[uint32]string, len(entries))
	for _, e := range entries {
		u, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil || strconv.FormatUint(u, 10) != e.Name() {
			continue // the lock file, or something that is no entry
		}
		dir, err := os.ReadFile(filepath.Join(b.users.Registry, e.Name()))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("uid registry: %w", err)
		}
		out[uint32(u)] = string(dir)
	}
	return out, nil
}

// claimDir creates the directory dir of a new environment, owned by root with group uid and
// mode 0710, for the lowest uid of the range that no environment holds and no process runs as,
// and records the claim. Claims whose directory is gone and whose uid runs nothing are stale and
// taken over. The caller holds the environment's lock.
func (b *Backend) claimDir(ctx context.Context, dir string) (uint32, error) {
	unlock, err := b.lockUIDs(ctx)
	if err != nil {
		return 0, err
	}
	defer unlock()
	held, err := b.registry()
	if err != nil {
		return 0, err
	}
	busy, err := scanUIDs()
	if err != nil {
		return 0, err
	}
	for i := range b.users.Count {
		u := b.users.First + i
		if busy[u] {
			continue
		}
		entry := filepath.Join(b.users.Registry, strconv.FormatUint(uint64(u), 10))
		if owner, ok := held[u]; ok {
			if _, err := os.Lstat(owner); owner != "" && !errors.Is(err, fs.ErrNotExist) {
				continue
			}
			// Its environment is gone and nothing runs as u: a claim left by a crash.
			if err := os.Remove(entry); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return 0, fmt.Errorf("uid registry: %w", err)
			}
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return 0, err
		}
		if err := errors.Join(os.Chown(dir, 0, int(u)), os.Chmod(dir, 0o710), writeEntry(entry, dir)); err != nil {
			_ = os.Remove(dir)
			return 0, err
		}
		return u, nil
	}
	return 0, fmt.Errorf("%w: all %d uids from %d are held or running", ErrNoFreeUID, b.users.Count, b.users.First)
}

func writeEntry(p, dir string) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("uid registry: %w", err)
	}
	_, err = f.WriteString(dir)
	return errors.Join(err, f.Sync(), f.Close())
}

// uidOf returns the uid environment directory dir holds, or noUID.
func (b *Backend) uidOf(ctx context.Context, dir string) (int, error) {
	if b.users == nil {
		return noUID, nil
	}
	unlock, err := b.lockUIDs(ctx)
	if err != nil {
		return noUID, err
	}
	defer unlock()
	held, err := b.registry()
	if err != nil {
		return noUID, err
	}
	for u, owner := range held {
		if owner == dir {
			return int(u), nil
		}
	}
	return noUID, nil
}

// releaseUID drops the claim of dir on uid, once nothing of the environment remains.
func (b *Backend) releaseUID(ctx context.Context, uid int, dir string) error {
	if uid == noUID {
		return nil
	}
	unlock, err := b.lockUIDs(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	entry := filepath.Join(b.users.Registry, strconv.Itoa(uid))
	owner, err := os.ReadFile(entry)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && string(owner) != dir) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("uid registry: %w", err)
	}
	if err := os.Remove(entry); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("uid registry: %w", err)
	}
	return nil
}

// credential is what the environment of uid runs as.
func credential(uid uint32) *syscall.Credential {
	return &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}
}
