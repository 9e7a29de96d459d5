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

// builds are the bed's two images, each built at most once per process.
var builds = struct{ nats, dynrunner imageBuild }{
	nats:      imageBuild{pkg: "github.com/nats-io/nats-server/v2", bin: "nats-server", tag: NATSImage},
	dynrunner: imageBuild{pkg: "github.com/dynrunner/dynrunner/cmd/dynrunner", bin: "dynrunner", tag: DynrunnerImage, cmd: []string{"controller"}},
}

type imageBuild struct {
	pkg, bin, tag string
	cmd           []string

	once sync.Once
	id   string
	err  error
}

// BuildImages builds (once per process) the nats-server image, from the nats-server module
// this module requires, and the dynrunner image, each a static binary in an image FROM
// scratch, loaded with `docker import` (no registry, no builder).
func BuildImages(ctx context.Context) (Images, error) {
	nats, err := BuildNATSImage(ctx)
	if err != nil {
		return Images{}, err
	}
	dyn, err := builds.dynrunner.build(ctx)
	if err != nil {
		return Images{}, err
	}
	return Images{NATS: nats, Dynrunner: dyn}, nil
}

// BuildNATSImage builds (once per process) the nats-server image alone, as BuildImages does.
func BuildNATSImage(ctx context.Context) (string, error) { return builds.nats.build(ctx) }

func (b *imageBuild) build(ctx context.Context) (string, error) {
	b.once.Do(func() { b.id, b.err = buildImage(ctx, b.pkg, b.bin, b.tag, b.cmd) })
	return b.id, b.err
}

func buildImage(ctx context.Context, pkg, bin, tag string, cmd []string) (string, error) {
	dir, err := os.MkdirTemp("", "fleetbed-images-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, bin)
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("fleetbed: go build %s: %w\n%s", pkg, err, msg)
	}
	return importImage(ctx, out, tag, cmd)
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
