package kubetest

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// ImageRepository is the repository part of the references TestBinaryImage returns; no registry
// serves it: the Kubelet resolves such references to local images by digest.
const ImageRepository = "kubetest.local/test-binary"

// The image of the running test binary, built once per process.
var (
	imageOnce sync.Once
	imageID   string
	imageErr  error
)

// TestBinaryImage builds (once per process) an image FROM scratch whose entrypoint is a static
// build of the running test binary, and returns it pinned by digest as
// ImageRepository@sha256:<the image ID's hex>, the form Pods name images in; the Kubelet runs it.
// A test binary that finds its own marker variable in the environment can then play a
// program inside the Pod (see podworker/kube's tests). It skips the test when the Docker engine
// is unavailable (NeedDocker). Call RemoveTestBinaryImage from TestMain after the tests.
func TestBinaryImage(t *testing.T) string {
	t.Helper()
	return ImageRepository + "@" + TestBinaryImageID(t)
}

// TestBinaryImageID is TestBinaryImage's image as the Docker engine names it (sha256:<hex>),
// for tests that run the test binary in containers directly (podworker/docker's).
func TestBinaryImageID(t *testing.T) string {
	t.Helper()
	NeedDocker(t)
	imageOnce.Do(func() {
		began := time.Now()
		imageID, imageErr = buildTestBinaryImage()
		t.Logf("kubetest: test image built in %v", time.Since(began).Round(time.Millisecond))
	})
	if imageErr != nil {
		t.Fatalf("kubetest: build the test image: %v", imageErr)
	}
	return imageID
}

// RemoveTestBinaryImage removes the image TestBinaryImage built, if any.
func RemoveTestBinaryImage() {
	if imageID == "" {
		return
	}
	eng := newEngine(DockerSocket)
	defer eng.close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = eng.call(ctx, http.MethodDelete, "/images/"+imageID, url.Values{"force": {"1"}}, nil, nil)
}

func buildTestBinaryImage() (string, error) {
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
	eng := newEngine(DockerSocket)
	defer eng.close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	q := url.Values{"rm": {"1"}, "forcerm": {"1"}, "labels": {`{"kubetest":"test-binary"}`}}
	resp, err := eng.do(ctx, http.MethodPost, "/build", q, &ctxTar, "application/x-tar")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
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
	if !imageIDRe.MatchString(id) {
		return "", fmt.Errorf("build named no image ID:\n%s", log.String())
	}
	return id, nil
}

// staticTestBinary returns the running test binary when it is statically linked, else a
// static build of the tests of the package in the working directory (CGO_ENABLED=0 go test
// -c), which a FROM scratch image can run.
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
	dir, err := os.MkdirTemp("", "kubetest-helper-")
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
