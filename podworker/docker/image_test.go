package docker_test

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dynrunner/dynrunner/podworker/docker"
)

// engineHTTP is an HTTP client of the engine's socket, independent of the package under test.
var engineHTTP = &http.Client{Transport: &http.Transport{
	DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", docker.DefaultSocket)
	},
}}

// engineJSON calls the engine's API (unversioned path) and decodes its answer into out.
func engineJSON(ctx context.Context, method, path string, body io.Reader, out any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://docker"+path, body)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := engineHTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

// needDocker skips the test when the engine does not answer, and fails it in CI.
func needDocker(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real containers on the Docker engine; run without -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	code, err := engineJSON(ctx, http.MethodGet, "/_ping", nil, nil)
	if err == nil && code == http.StatusOK {
		return
	}
	msg := fmt.Sprintf("the Docker engine at %s does not answer (%v, status %d); start it with `systemctl start docker` (or `dockerd &`) and run as root or a member of the docker group",
		docker.DefaultSocket, err, code)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// The test image: FROM scratch with a static build of this test binary as its entrypoint.
var (
	imageOnce sync.Once
	imageID   string
	imageErr  error
)

func testImage(t *testing.T) string {
	t.Helper()
	needDocker(t)
	imageOnce.Do(func() { imageID, imageErr = buildTestImage() })
	if imageErr != nil {
		t.Fatalf("build the test image: %v", imageErr)
	}
	return imageID
}

func removeTestImage() {
	if imageID == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, _ = engineJSON(ctx, http.MethodDelete, "/images/"+imageID+"?force=1", nil, nil)
}

func buildTestImage() (string, error) {
	bin, cleanup, err := staticTestBinary()
	if err != nil {
		return "", err
	}
	defer cleanup()
	exe, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	var ctxTar bytes.Buffer
	tw := tar.NewWriter(&ctxTar)
	for _, f := range []struct {
		name string
		mode int64
		data []byte
	}{
		{"Dockerfile", 0o644, []byte("FROM scratch\nCOPY helper /helper\nENTRYPOINT [\"/helper\"]\n")},
		{"helper", 0o755, exe},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data))}); err != nil {
			return "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://docker/build?rm=1&forcerm=1&labels="+
		`%7B%22dynrunner.test%22%3A%22podworker-docker%22%7D`, &ctxTar)
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := engineHTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return "", fmt.Errorf("build: %s: %s", resp.Status, b)
	}
	// The answer is a stream of JSON messages; the image ID comes as aux.ID.
	dec := json.NewDecoder(resp.Body)
	var id string
	var log strings.Builder
	for {
		var msg struct {
			Stream string `json:"stream"`
			Error  string `json:"error"`
			Aux    struct {
				ID string `json:"ID"`
			} `json:"aux"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return "", err
		}
		log.WriteString(msg.Stream)
		if msg.Error != "" {
			return "", fmt.Errorf("build: %s\n%s", msg.Error, log.String())
		}
		if msg.Aux.ID != "" {
			id = msg.Aux.ID
		}
	}
	if !strings.HasPrefix(id, "sha256:") {
		return "", fmt.Errorf("build named no image ID:\n%s", log.String())
	}
	return id, nil
}

// staticTestBinary returns this test binary when it is statically linked, else a static build
// of the package's tests (CGO_ENABLED=0 go test -c), which a FROM scratch image can run.
func staticTestBinary() (string, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	if static, err := isStatic(exe); err != nil {
		return "", nil, err
	} else if static {
		return exe, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "dynrunner-docker-helper-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	out := filepath.Join(dir, "helper")
	cmd := exec.Command("go", "test", "-c", "-o", out, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("CGO_ENABLED=0 go test -c: %w\n%s", err, b)
	}
	return out, cleanup, nil
}

// isStatic reports whether the ELF executable p needs no dynamic loader.
func isStatic(p string) (bool, error) {
	f, err := elf.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}
