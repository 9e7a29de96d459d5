package podworker

import (
	"bufio"
	"errors"
	"io"
	"strings"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// EnvName is the name an assignment's environment goes by in a backend (a container, a Pod,
// a directory): prefix, then "<task>-<epoch>". Both parts are decimal, so the name is a safe
// single path element and a valid DNS label part.
func EnvName(prefix string, task assignment.TaskID, epoch assignment.Epoch) string {
	return prefix + task.String() + "-" + epoch.String()
}

// ParseEnvName is the inverse of EnvName with the same prefix; ok is false for any other name,
// including one that differs from EnvName's only in its spelling of the numbers.
func ParseEnvName(prefix, name string) (task assignment.TaskID, epoch assignment.Epoch, ok bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, 0, false
	}
	t, e, found := strings.Cut(rest, "-")
	if !found {
		return 0, 0, false
	}
	task, err := assignment.ParseTaskID(t)
	if err != nil {
		return 0, 0, false
	}
	epoch, err = assignment.ParseEpoch(e)
	if err != nil {
		return 0, 0, false
	}
	return task, epoch, true
}

// Bounds on what a Diagnoser reads of an environment's log: its last DiagnoseTail lines, at
// most DiagnoseMaxBytes bytes.
const (
	DiagnoseTail     = 200
	DiagnoseMaxBytes = 1 << 20
)

// LastErrorLine returns the last line of r that starts, after trimming white space, with one of
// prefixes (ExecutorErrorPrefix, LauncherErrorPrefix): what a Diagnoser returns. It reads at
// most limit bytes; a line longer than that ends the scan without an error, and what came
// before it still counts.
func LastErrorLine(r io.Reader, limit int, prefixes ...string) (string, error) {
	var last string
	sc := bufio.NewScanner(io.LimitReader(r, int64(limit)))
	sc.Buffer(make([]byte, min(64<<10, limit)), limit)
	for sc.Scan() {
		s := strings.TrimSpace(sc.Text())
		for _, p := range prefixes {
			if strings.HasPrefix(s, p) {
				last = s
				break
			}
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, bufio.ErrTooLong) {
		return last, err
	}
	return last, nil
}
