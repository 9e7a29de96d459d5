package fleetbed

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Image names the bed's images carry (tagged, so a rebuild replaces the last one).
const (
	NATSImage      = "dynrunner-fleetbed/nats-server:test"
	DynrunnerImage = "dynrunner-fleetbed/dynrunner:test"
)

// Images are the bed's images, by ID.
type Images struct {
	NATS, Dynrunner string
}

var (
	imagesOnce sync.Once
	images     Images
	imagesErr  error
)

// BuildImages builds (once per process) the nats-server image, from the nats-server module
// this module requires, and the dynrunner image, each a static binary in an image FROM
// scratch, loaded with `docker import` (no registry, no builder).
func BuildImages(ctx context.Context) (Images, error) {
	imagesOnce.Do(func() { images, imagesErr = buildImages(ctx) })
	return images, imagesErr
}

func buildImages(ctx context.Context) (Images, error) {
	dir, err := os.MkdirTemp("", "fleetbed-images-")
	if err != nil {
		return Images{}, err
	}
	defer os.RemoveAll(dir)
	var im Images
	for _, b := range []struct {
		pkg, bin, tag string
		cmd           []string
		id            *string
	}{
		{"github.com/nats-io/nats-server/v2", "nats-server", NATSImage, nil, &im.NATS},
		{"github.com/dynrunner/dynrunner/cmd/dynrunner", "dynrunner", DynrunnerImage, []string{"controller"}, &im.Dynrunner},
	} {
		out := filepath.Join(dir, b.bin)
		build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, b.pkg)
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := build.CombinedOutput(); err != nil {
			return Images{}, fmt.Errorf("fleetbed: go build %s: %w\n%s", b.pkg, err, msg)
		}
		id, err := importImage(ctx, out, b.tag, b.cmd)
		if err != nil {
			return Images{}, err
		}
		*b.id = id
	}
	return im, nil
}

// importImage loads an image holding bin at /<name> (its entrypoint, cmd its arguments) and
// an empty /tmp.
func importImage(ctx context.Context, bin, tag string, cmd []string) (string, error) {
	exe, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	name := filepath.Base(bin)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}); err != nil {
		return "", err
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(exe))}); err != nil {
		return "", err
	}
	if _, err := tw.Write(exe); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	changes := []string{"-c", fmt.Sprintf(`ENTRYPOINT [%q]`, "/"+name)}
	if len(cmd) > 0 {
		changes = append(changes, "-c", `CMD ["`+strings.Join(cmd, `", "`)+`"]`)
	}
	args := append(append([]string{"import"}, changes...), "-", tag)
	id, err := dockerIn(ctx, &buf, args...)
	if err != nil {
		return "", fmt.Errorf("fleetbed: import %s: %w", tag, err)
	}
	return id, nil
}
