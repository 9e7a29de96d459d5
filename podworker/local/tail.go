package local

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/dynrunner/dynrunner/podworker"
)

var _ podworker.Diagnoser = (*Backend)(nil)

// maxTail bounds how much of executor.log Diagnose reads.
const maxTail = 64 << 10

// Diagnose returns the executor's (or launcher's) own final error line from executor.log, if
// it wrote one. Only lines they print about themselves are returned, never the job's output.
func (b *Backend) Diagnose(_ context.Context, h podworker.Handle) (string, error) {
	id, err := b.checkHandle(h)
	if err != nil {
		return "", err
	}
	f, err := os.Open(filepath.Join(b.dir(id), logFile))
	if err != nil {
		return "", fmt.Errorf("local: diagnose %s: %w", id, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > maxTail {
		if _, err := f.Seek(-maxTail, io.SeekEnd); err != nil {
			return "", fmt.Errorf("local: diagnose %s: %w", id, err)
		}
	}
	last, err := podworker.LastErrorLine(f, maxTail, podworker.ExecutorErrorPrefix, podworker.LauncherErrorPrefix)
	if err != nil {
		return last, fmt.Errorf("local: diagnose %s: %w", id, err)
	}
	return last, nil
}
