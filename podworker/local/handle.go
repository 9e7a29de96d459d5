package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
)

// Keys of Handle.Data.
const (
	dataPID       = "pid"
	dataPGID      = "pgid"
	dataStartTime = "start_time"
	dataDir       = "dir"
	dataUID       = "uid" // with Config.Users: the uid (and gid) the environment runs as
)

// Names inside an environment directory.
const (
	handleFile = "handle.json"
	exitFile   = "exit.json"
	logFile    = "executor.log"
	secretsDir = "secrets"
	workDir    = "work"
	homeDir    = "home"
	tmpDir     = "tmp"
	locksDir   = ".locks"
)

// envID is the directory name, and Handle.ID, of an assignment's environment.
func envID(task assignment.TaskID, epoch assignment.Epoch) string {
	return podworker.EnvName("", task, epoch)
}

// parseEnvID is the inverse of envID; ok is false for any other name.
func parseEnvID(id string) (assignment.TaskID, assignment.Epoch, bool) {
	return podworker.ParseEnvName("", id)
}

// validName reports whether name is safe as a single entry of a directory the backend owns: not
// empty, no separator, no "..", no NUL, and not a dot-entry when dots is false.
func validName(name string, dots bool) bool {
	if name == "" || len(name) > 255 || strings.ContainsAny(name, "/\x00") ||
		strings.Contains(name, "..") || name == "." {
		return false
	}
	return dots || name[0] != '.'
}

// procRef identifies the executor process of an environment across PID reuse.
type procRef struct {
	pid   int
	pgid  int
	start uint64
}

// refFromData reads a procRef from Handle.Data; ok is false when Data holds none. The executor
// leads its own process group, so pgid must equal pid.
func refFromData(data map[string]string) (procRef, bool, error) {
	if data == nil || data[dataPID] == "" {
		return procRef{}, false, nil
	}
	pid, err1 := strconv.Atoi(data[dataPID])
	pgid, err2 := strconv.Atoi(data[dataPGID])
	start, err3 := strconv.ParseUint(data[dataStartTime], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil || pid <= 1 || pgid != pid {
		return procRef{}, false, fmt.Errorf("process data %v: %w", data, ErrInvalidHandle)
	}
	return procRef{pid: pid, pgid: pgid, start: start}, true, nil
}

func (r procRef) data(dir string) map[string]string {
	return map[string]string{
		dataPID:       strconv.Itoa(r.pid),
		dataPGID:      strconv.Itoa(r.pgid),
		dataStartTime: strconv.FormatUint(r.start, 10),
		dataDir:       dir,
	}
}

// alive reports whether the process still runs (a zombie does not).
func (r procRef) alive() bool {
	st, err := readStat(r.pid)
	return err == nil && st.Start == r.start && !st.Exited()
}

// readHandle reads the handle.json of environment id through root, which refuses to follow
// symbolic links out of the root directory. It checks that the file describes environment id.
func readHandle(root *os.Root, id string) (podworker.Handle, error) {
	b, err := root.ReadFile(path.Join(id, handleFile))
	if err != nil {
		return podworker.Handle{}, err
	}
	var h podworker.Handle
	if err := json.Unmarshal(b, &h); err != nil {
		return podworker.Handle{}, fmt.Errorf("%s: %w", handleFile, err)
	}
	if h.Backend != backendName || h.ID != id || envID(h.Task, h.Epoch) != id {
		return podworker.Handle{}, fmt.Errorf("%s does not describe %s: %w", handleFile, id, ErrInvalidHandle)
	}
	if _, ok, err := refFromData(h.Data); !ok || err != nil {
		return podworker.Handle{}, fmt.Errorf("%s has no process: %w", handleFile, ErrInvalidHandle)
	}
	return h, nil
}

// exitRecord is the content of exit.json.
type exitRecord struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	Code      int    `json:"code"`
	Reason    string `json:"reason"`
}

// readExit returns the exit recorded for ref in the directory of environment id, if any.
func readExit(root *os.Root, id string, ref procRef) (podworker.Exit, bool) {
	b, err := root.ReadFile(path.Join(id, exitFile))
	if err != nil {
		return podworker.Exit{}, false
	}
	var rec exitRecord
	if json.Unmarshal(b, &rec) != nil || rec.PID != ref.pid || rec.StartTime != ref.start {
		return podworker.Exit{}, false
	}
	return podworker.Exit{Code: rec.Code, Reason: rec.Reason}, true
}

// writeFileAtomic writes data to dir/name through a temporary file, a rename and fsyncs, so a
// reader sees the old content or the new, never a part.
func writeFileAtomic(dir, name string, data []byte) (err error) {
	tmp, err := os.CreateTemp(dir, "."+name+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dir+"/"+name); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, fs.ErrInvalid) {
		return err
	}
	return nil
}
