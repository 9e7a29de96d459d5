package local

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"
)

// OpenStateDir prepares the controller's state directory dir (STATE_DIR) for environments that
// run under uids of their own (Config.Users) with Root at dir/envs: it makes dir 0711, so that
// they pass through it to their Root, and takes every access for other users from its other
// entries (the controller creates them without any; this catches what someone else put
// there), logging each one it changes. Symbolic links are left alone. Its errors are the
// file system's, which name the path.
func OpenStateDir(dir string, log zerolog.Logger) error {
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Name() == "envs" || e.Type()&os.ModeSymlink != 0 {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		if perm := fi.Mode().Perm(); perm&0o007 != 0 {
			p := filepath.Join(dir, e.Name())
			if err := os.Chmod(p, perm&^0o007); err != nil {
				return err
			}
			log.Warn().Str("path", p).Str("was", fmt.Sprintf("%04o", perm)).Msg("took other users' access away from an entry of STATE_DIR: local environments pass through STATE_DIR")
		}
	}
	return nil
}
