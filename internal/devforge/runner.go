package devforge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"text/template"
)

// StaticRunner is a real gitea-runner daemon in host mode, registered once and running until
// Close: the baseline dynrunner is compared with.
type StaticRunner struct {
	name string
	dir  string
	proc *process
}

// StartStaticRunner registers a gitea-runner named after dir (static-<base of dir>) at forgeURL
// with regToken and labels in host mode (e.g. "self-hosted:host", "pod:host"), then runs
// `gitea-runner daemon` until Close. All its files live in dir: config.yaml, the .runner
// registration and the job work directories. The runner takes one job at a time, polls every
// second and runs its cache server, as a runner does by default. A registration already in dir is replaced. logw
// (may be nil) receives the runner's output.
func StartStaticRunner(ctx context.Context, tools Tools, forgeURL, regToken string, labels []string, dir string, logw io.Writer) (*StaticRunner, error) {
	if len(labels) == 0 {
		return nil, errors.New("devforge: static runner needs at least one label")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("devforge: static runner dir: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "work"), 0o700); err != nil {
		return nil, fmt.Errorf("devforge: static runner dir: %w", err)
	}
	r := &StaticRunner{name: "static-" + filepath.Base(dir), dir: dir}
	config := filepath.Join(dir, "config.yaml")
	if err := writeRunnerConfig(config, dir, labels); err != nil {
		return nil, err
	}

	reg := exec.CommandContext(ctx, tools.RunnerBin, "register", "--config", config, "--no-interactive",
		"--instance", forgeURL, "--token", regToken, "--name", r.name) // labels come from config.yaml
	reg.Dir = dir
	out, err := reg.CombinedOutput()
	if logw != nil {
		_, _ = logw.Write(out)
	}
	if err != nil {
		return nil, fmt.Errorf("devforge: register static runner: %w: %s", err, out)
	}

	// The daemon lives until Close, not until ctx ends.
	daemon := exec.Command(tools.RunnerBin, "daemon", "--config", config)
	daemon.Dir = dir
	r.proc, err = startProcess("gitea-runner daemon", daemon, logw)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// Name is the runner's registered name.
func (r *StaticRunner) Name() string { return r.name }

// Dir is the runner's directory.
func (r *StaticRunner) Dir() string { return r.dir }

// Close stops the daemon (SIGTERM, then SIGKILL after a bound); a running job is cancelled.
// It is idempotent.
func (r *StaticRunner) Close() error {
	if r == nil || r.proc == nil {
		return nil
	}
	return r.proc.stop()
}

var runnerConfig = template.Must(template.New("config.yaml").Funcs(template.FuncMap{
	// A Go-quoted string is a valid YAML double-quoted scalar.
	"q": strconv.Quote,
}).Parse(`# written by devforge
log:
  level: info
runner:
  file: {{q .File}}
  capacity: 1
  timeout: 1h
  shutdown_timeout: 0s
  insecure: false
  fetch_timeout: 5s
  fetch_interval: 1s
  fetch_interval_max: 1s
  report_close_timeout: 10s
  labels:
{{- range .Labels}}
    - {{q .}}
{{- end}}
cache:
  enabled: true
  dir: {{q .Cache}}
container:
  require_docker: false
host:
  workdir_parent: {{q .Work}}
`))

func writeRunnerConfig(path, dir string, labels []string) error {
	var buf bytes.Buffer
	err := runnerConfig.Execute(&buf, map[string]any{
		"File":   filepath.Join(dir, ".runner"),
		"Work":   filepath.Join(dir, "work"),
		"Cache":  filepath.Join(dir, "cache"),
		"Labels": labels,
	})
	if err != nil {
		return fmt.Errorf("devforge: runner config: %w", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("devforge: runner config: %w", err)
	}
	return nil
}
