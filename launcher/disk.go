package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// fsNames names the file systems by statfs(2) magic, for error messages.
var fsNames = map[int64]string{
	0x01021994: "tmpfs",
	0x794c7630: "overlayfs",
	0xef53:     "ext4",
	0x58465342: "xfs",
	0x9123683e: "btrfs",
	0x6969:     "nfs",
	0x2fc12fc1: "zfs",
	0x01021997: "9p",
	0x65735546: "fuse",
	0x73717368: "squashfs",
	0x858458f6: "ramfs",
}

// fsName returns the name of the file system holding path.
func fsName(path string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return "an unknown file system"
	}
	if n, ok := fsNames[int64(st.Type)]; ok { //nolint:unconvert // Statfs_t.Type is not int64 everywhere

		return n
	}
	return fmt.Sprintf("a file system of type %#x", st.Type)
}

// probeDirectIO creates a file in dir with O_DIRECT and removes it. When the file system
// refuses (EINVAL, as tmpfs does) the error wraps ErrNoDirectIO and says what to do.
func probeDirectIO(dir string) error {
	p := filepath.Join(dir, ".odirect-probe")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL|syscall.O_DIRECT|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return directIOError(dir, err)
	}
	_ = f.Close()
	return os.Remove(p)
}

// directIOError explains a failed O_DIRECT probe of the instance directory dir.
func directIOError(dir string, err error) error {
	if errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("launcher: %s is on %s, which refuses O_DIRECT (the root disk is converted "+
			"and used with direct I/O): put --root on ext4 or xfs: %w", dir, fsName(dir), ErrNoDirectIO)
	}
	return fmt.Errorf("launcher: probe O_DIRECT in %s: %w", dir, err)
}

// probeImageDirectIO opens the image with O_DIRECT for reading (qemu-img reads it with -T none).
func probeImageDirectIO(image string) error {
	f, err := os.OpenFile(image, os.O_RDONLY|syscall.O_DIRECT, 0)
	if errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("launcher: --image %s is on %s, which refuses O_DIRECT: keep base images on ext4 or xfs: %w",
			image, fsName(image), ErrNoDirectIO)
	}
	if err != nil {
		return fmt.Errorf("launcher: open --image: %w", err)
	}
	return f.Close()
}

// imageInfo is what the launcher reads from `qemu-img info --output=json`.
type imageInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
}

// inspectImage returns the format and virtual size of the base image. Only raw and qcow2
// without a backing file are accepted: the instance disk must be flat and must not read any
// other host file.
func inspectImage(ctx context.Context, image string) (imageInfo, error) {
	out, err := run(ctx, "qemu-img", "info", "--output=json", image)
	if err != nil {
		return imageInfo{}, fmt.Errorf("launcher: inspect --image: %w", err)
	}
	var info imageInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return imageInfo{}, fmt.Errorf("launcher: inspect --image: qemu-img info: %w", err)
	}
	switch {
	case info.Format != "raw" && info.Format != "qcow2":
		return info, invalidf("--image %s: format %q, want qcow2 or raw", image, info.Format)
	case info.BackingFilename != "":
		return info, invalidf("--image %s: has a backing file %q; flatten it first (qemu-img convert)", image, info.BackingFilename)
	case info.VirtualSize <= 0:
		return info, invalidf("--image %s: virtual size %d", image, info.VirtualSize)
	}
	return info, nil
}

// convertDisk writes the flat qcow2 root disk dst from the base image with direct I/O on both
// sides and grows it to sizeGiB.
func convertDisk(ctx context.Context, image, dst string, sizeGiB int) error {
	info, err := inspectImage(ctx, image)
	if err != nil {
		return err
	}
	size := int64(sizeGiB) << 30
	if info.VirtualSize > size {
		return invalidf("--image %s: virtual size %d bytes exceeds --disk-gib %d", image, info.VirtualSize, sizeGiB)
	}
	if _, err := run(ctx, "qemu-img", "convert", "-q", "-t", "none", "-T", "none",
		"-f", info.Format, "-O", "qcow2", "-o", "preallocation=off", image, dst); err != nil {
		return fmt.Errorf("launcher: convert the root disk: %w", err)
	}
	if info.VirtualSize < size {
		if _, err := run(ctx, "qemu-img", "resize", "-q", "-f", "qcow2", dst, strconv.FormatInt(size, 10)); err != nil {
			return fmt.Errorf("launcher: resize the root disk: %w", err)
		}
	}
	return nil
}
