package launcher

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// benchImage writes a raw base image of size bytes, a quarter of it data: 1 MiB of random
// bytes at the start of every 4 MiB, the rest holes (a typical mostly-empty root file system
// has its data spread like this).
func benchImage(b *testing.B, dir string, size int64) string {
	b.Helper()
	p := filepath.Join(dir, fmt.Sprintf("base-%dg.raw", size>>30))
	f, err := os.Create(p)
	require.NoError(b, err)
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for off := int64(0); off < size; off += 4 << 20 {
		_, _ = rand.Read(chunk)
		_, err := f.WriteAt(chunk, off)
		require.NoError(b, err)
	}
	require.NoError(b, f.Truncate(size))
	require.NoError(b, f.Sync())
	return p
}

// BenchmarkPrepare measures Prepare (disk conversion, seed, TAP) and Close for 1 GiB and
// 4 GiB base images, a quarter filled with data. Run as root with
// go test ./launcher -run '^$' -bench Prepare -benchtime 3x
func BenchmarkPrepare(b *testing.B) {
	for _, gib := range []int64{1, 4} {
		b.Run(fmt.Sprintf("%dGiB", gib), func(b *testing.B) {
			e := newVMEnv(b)
			image := benchImage(b, e.root, gib<<30)
			var disk, seed, network, total time.Duration
			b.ResetTimer()
			for b.Loop() {
				c := e.config(b, "")
				c.Image, c.DiskGiB = image, 20
				inst, err := Prepare(context.Background(), c, zerolog.Nop())
				require.NoError(b, err)
				tm := inst.Timings()
				disk, seed, network, total = disk+tm.Disk, seed+tm.Seed, network+tm.Network, total+tm.Total
				b.StopTimer()
				require.NoError(b, inst.Close())
				b.StartTimer()
			}
			n := time.Duration(b.N)
			b.ReportMetric(float64(disk/n)/1e6, "disk-ms")
			b.ReportMetric(float64(seed/n)/1e6, "seed-ms")
			b.ReportMetric(float64(network/n)/1e6, "net-ms")
			b.ReportMetric(float64(total/n)/1e6, "prepare-ms")
		})
	}
}

// BenchmarkBootToPing measures, under QEMU TCG, the time from starting the hypervisor to the
// guest's GET /v1/ping on the endpoint, and to its power-off.
func BenchmarkBootToPing(b *testing.B) {
	e := newVMEnv(b)
	var ping, off time.Duration
	for b.Loop() {
		c := e.config(b, "ping")
		inst, err := Prepare(context.Background(), c, zerolog.Nop())
		require.NoError(b, err)
		start := time.Now()
		require.NoError(b, inst.Run(context.Background()))
		off += time.Since(start)
		select {
		case at := <-e.pings:
			ping += at.Sub(start)
		default:
			require.FailNow(b, "no ping")
		}
		require.NoError(b, inst.Close())
	}
	b.ReportMetric(float64(ping/time.Duration(b.N))/1e6, "boot-to-ping-ms")
	b.ReportMetric(float64(off/time.Duration(b.N))/1e6, "boot-to-poweroff-ms")
}
