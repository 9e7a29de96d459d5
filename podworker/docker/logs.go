package docker

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strconv"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/client"

	"github.com/dynrunner/dynrunner/podworker"
)

var _ podworker.Diagnoser = (*Backend)(nil)

// Diagnose returns the executor's own final error line, if it wrote one. It reads only the
// container's stderr, where the executor logs; the job's output goes to stdout and is never
// returned.
func (b *Backend) Diagnose(ctx context.Context, h podworker.Handle) (string, error) {
	ref, err := b.checkHandle(h)
	if err != nil {
		return "", err
	}
	api, err := b.eng.api(ctx)
	if err != nil {
		return "", fmt.Errorf("docker: diagnose %s: %w", h.ID, err)
	}
	logs, err := api.ContainerLogs(ctx, ref, client.ContainerLogsOptions{ShowStderr: true, Tail: strconv.Itoa(podworker.DiagnoseTail)})
	if cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("docker: diagnose %s: %w", h.ID, podworker.ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("docker: diagnose %s: %w", h.ID, err)
	}
	defer logs.Close()
	last, err := lastExecutorError(io.LimitReader(logs, podworker.DiagnoseMaxBytes))
	if err != nil {
		return last, fmt.Errorf("docker: diagnose %s: %w", h.ID, err)
	}
	return last, nil
}

// lastExecutorError returns the last line starting with podworker.ExecutorErrorPrefix of the
// stderr in logs, the engine's multiplexed log stream (the backend never gives a container a
// TTY), which stdcopy takes apart.
func lastExecutorError(logs io.Reader) (string, error) {
	var stderr bytes.Buffer
	// On an error (the stream broke, or the engine reported one in it), what came before still
	// counts.
	_, cerr := stdcopy.StdCopy(io.Discard, &stderr, logs)
	last, err := podworker.LastErrorLine(&stderr, podworker.DiagnoseMaxBytes, podworker.ExecutorErrorPrefix)
	if err != nil {
		return last, err
	}
	return last, cerr
}
