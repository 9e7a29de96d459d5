package workload

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/secretfile"
	"github.com/dynrunner/dynrunner/internal/testbed/workloadtest"
)

func mustIssue(t *testing.T, ca *DevCA, id string) *x509svid.SVID {
	t.Helper()
	svid, err := ca.Issue(mustID(t, id), time.Hour)
	require.NoError(t, err)
	return svid
}

// waitFor polls cond every 10ms for at most 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			require.Failf(t, "timed out", "waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func serialOf(t *testing.T, src Source) string {
	t.Helper()
	svid, err := src.GetX509SVID()
	require.NoError(t, err)
	return svid.Certificates[0].SerialNumber.String()
}

func TestWriteSVIDFiles(t *testing.T) {
	ca := newCA(t, testTD)
	svid := mustIssue(t, ca, "spiffe://ci.example.org/dynrunner/task/1/epoch/1")
	dir := filepath.Join(t.TempDir(), "env", "svid")
	require.NoError(t, WriteSVIDFiles(dir, svid, ca.Bundle()), "WriteSVIDFiles()")
	if fi, err := os.Stat(dir); assert.NoError(t, err, "dir") {
		assert.EqualValues(t, 0o700, fi.Mode().Perm(), "dir mode = %04o, want 0700", fi.Mode().Perm())
	}
	for _, name := range []string{SVIDFile, SVIDKeyFile, BundleFile} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.EqualValues(t, 0o600, fi.Mode().Perm(), "%s mode = %04o, want 0600", name, fi.Mode().Perm())
	}
	// The files are what go-spiffe's own loaders read.
	loaded, err := x509svid.Load(filepath.Join(dir, SVIDFile), filepath.Join(dir, SVIDKeyFile))
	require.NoError(t, err, "x509svid.Load()")
	assert.Equal(t, svid.ID, loaded.ID, "loaded SVID ID differs from the written one")
	assert.True(t, loaded.Certificates[0].Equal(svid.Certificates[0]), "loaded SVID differs from the written one")
	bundle, err := x509bundle.Load(testTD, filepath.Join(dir, BundleFile))
	if assert.NoError(t, err, "x509bundle.Load()") {
		assert.True(t, bundle.Equal(ca.Bundle()), "x509bundle.Load() = %v; want the CA bundle", bundle)
	}
	assert.Error(t, WriteSVIDFiles(dir, nil, ca.Bundle()), "WriteSVIDFiles(nil svid) succeeded")
}

func TestFromFilesWaitsAndReloads(t *testing.T) {
	ca := newCA(t, testTD)
	dir := filepath.Join(t.TempDir(), "svid")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	type result struct {
		src Source
		err error
	}
	done := make(chan result, 1)
	go func() {
		src, err := FromFiles(ctx, dir, 10*time.Millisecond)
		done <- result{src, err}
	}()
	// Nothing there yet: FromFiles waits.
	time.Sleep(50 * time.Millisecond)
	select {
	case r := <-done:
		require.Failf(t, "returned early", "FromFiles() returned %v before the files existed", r.err)
	default:
	}

	first := mustIssue(t, ca, "spiffe://ci.example.org/dynrunner/task/42/epoch/7")
	require.NoError(t, WriteSVIDFiles(dir, first, ca.Bundle()))
	r := <-done
	require.NoError(t, r.err, "FromFiles()")
	src := r.src
	defer src.Close()
	svid, err := src.GetX509SVID()
	require.NoError(t, err)
	assert.Equal(t, first.ID, svid.ID, "ID")
	if b, err := src.GetX509BundleForTrustDomain(testTD); assert.NoError(t, err, "GetX509BundleForTrustDomain()") {
		assert.True(t, b.Equal(ca.Bundle()), "GetX509BundleForTrustDomain() = %v; want the CA bundle", b)
	}
	_, err = src.GetX509BundleForTrustDomain(otherTD)
	assert.Error(t, err, "GetX509BundleForTrustDomain(other) succeeded")

	// A rotation (new files) is picked up.
	second := mustIssue(t, ca, "spiffe://ci.example.org/dynrunner/task/42/epoch/7")
	require.NoError(t, WriteSVIDFiles(dir, second, ca.Bundle()))
	assert.Equal(t, second.Certificates[0].SerialNumber.String(), serialOf(t, src), "serial after rotation")

	// A broken replacement keeps the last good SVID.
	require.NoError(t, secretfile.WriteNew(filepath.Join(dir, SVIDFile), []byte("garbage")))
	assert.Equal(t, second.Certificates[0].SerialNumber.String(), serialOf(t, src), "serial after a broken replacement")

	require.NoError(t, src.Close())
	_, err = src.GetX509SVID()
	assert.ErrorIs(t, err, ErrClosed, "GetX509SVID() after Close")
}

func TestFromFilesErrors(t *testing.T) {
	ca := newCA(t, testTD)
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string)
		wantErr error
	}{
		{
			name:    "nothing there until ctx ends",
			setup:   func(t *testing.T, dir string) {},
			wantErr: context.DeadlineExceeded,
		},
		{
			name: "key missing until ctx ends",
			setup: func(t *testing.T, dir string) {
				require.NoError(t, WriteSVIDFiles(dir, mustIssue(t, ca, "spiffe://ci.example.org/x"), ca.Bundle()))
				require.NoError(t, os.Remove(filepath.Join(dir, SVIDKeyFile)))
			},
			wantErr: fs.ErrNotExist,
		},
		{
			name: "world readable key is refused at once",
			setup: func(t *testing.T, dir string) {
				require.NoError(t, WriteSVIDFiles(dir, mustIssue(t, ca, "spiffe://ci.example.org/x"), ca.Bundle()))
				require.NoError(t, os.Chmod(filepath.Join(dir, SVIDKeyFile), 0o644))
			},
			wantErr: secretfile.ErrPermissions,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "svid")
			tt.setup(t, dir)
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			src, err := FromFiles(ctx, dir, 10*time.Millisecond)
			require.ErrorIs(t, err, tt.wantErr, "FromFiles() = %v, %v; want error %v", src, err, tt.wantErr)
		})
	}
}

func TestFromWorkloadAPI(t *testing.T) {
	ca := newCA(t, testTD)
	api := workloadtest.Start(t)
	first := mustIssue(t, ca, "spiffe://ci.example.org/dynrunner/task/42/epoch/7")
	require.NoError(t, api.SetX509SVID(first, ca.Bundle()))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	src, err := FromWorkloadAPI(ctx, api.Addr())
	require.NoError(t, err, "FromWorkloadAPI()")
	defer src.Close()
	svid, err := src.GetX509SVID()
	require.NoError(t, err)
	assert.Equal(t, first.ID, svid.ID, "ID")
	if b, err := src.GetX509BundleForTrustDomain(testTD); assert.NoError(t, err, "GetX509BundleForTrustDomain()") {
		assert.True(t, b.Equal(ca.Bundle()), "GetX509BundleForTrustDomain() = %v; want the CA bundle", b)
	}

	// Rotation is pushed over the stream.
	second := mustIssue(t, ca, "spiffe://ci.example.org/dynrunner/task/42/epoch/7")
	require.NoError(t, api.SetX509SVID(second, ca.Bundle()))
	want := second.Certificates[0].SerialNumber.String()
	waitFor(t, "the rotated SVID", func() bool { return serialOf(t, src) == want })

	require.NoError(t, src.Close())
	assert.NoError(t, src.Close(), "second Close()")
	_, err = src.GetX509SVID()
	assert.Error(t, err, "GetX509SVID() after Close succeeded")
}

func TestFromWorkloadAPIWaitsForSVID(t *testing.T) {
	ca := newCA(t, testTD)
	api := workloadtest.Start(t) // no identity yet, like an agent before the entry exists
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	type result struct {
		src Source
		err error
	}
	done := make(chan result, 1)
	go func() {
		src, err := FromWorkloadAPI(ctx, api.Addr())
		done <- result{src, err}
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case r := <-done:
		require.Failf(t, "returned early", "FromWorkloadAPI() returned %v before an SVID was issued", r.err)
	default:
	}
	svid := mustIssue(t, ca, "spiffe://ci.example.org/dynrunner/task/42/epoch/7")
	require.NoError(t, api.SetX509SVID(svid, ca.Bundle()))
	r := <-done
	require.NoError(t, r.err, "FromWorkloadAPI()")
	defer r.src.Close()
	assert.Equal(t, svid.Certificates[0].SerialNumber.String(), serialOf(t, r.src), "serial")
}

func TestFromWorkloadAPIErrors(t *testing.T) {
	api := workloadtest.Start(t) // never issues an identity
	tests := []struct {
		name    string
		addr    string
		wantErr error // nil: any error
	}{
		{name: "no identity until ctx ends", addr: api.Addr(), wantErr: context.DeadlineExceeded},
		{name: "no scheme", addr: "/run/spire/agent.sock"},
		{name: "tcp with a host name", addr: "tcp://localhost:1234"},
		{name: "empty", addr: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			src, err := FromWorkloadAPI(ctx, tt.addr)
			if err == nil {
				src.Close()
				require.Fail(t, "FromWorkloadAPI() succeeded, want an error")
			}
			if tt.wantErr != nil {
				assert.ErrorIs(t, err, tt.wantErr, "FromWorkloadAPI() error")
			}
		})
	}
}

// TestFromWorkloadAPIForPicksItsOwnSVID: a workload issued several SVIDs serves the one for
// its own identity, whatever their order, also after a rotation; and the first without one.
func TestFromWorkloadAPIForPicksItsOwnSVID(t *testing.T) {
	ca := newCA(t, testTD)
	api := workloadtest.Start(t)
	other := mustIssue(t, ca, "spiffe://ci.example.org/namespace-wide")
	own := mustIssue(t, ca, "spiffe://ci.example.org/dynrunner/task/42/epoch/7")
	require.NoError(t, api.SetX509SVIDs([]*x509svid.SVID{other, own}, ca.Bundle()))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	src, err := FromWorkloadAPIFor(ctx, api.Addr(), own.ID)
	require.NoError(t, err)
	defer src.Close()
	svid, err := src.GetX509SVID()
	require.NoError(t, err, "GetX509SVID()")
	require.Equal(t, own.ID, svid.ID, "GetX509SVID() ID")
	rotated := mustIssue(t, ca, "spiffe://ci.example.org/dynrunner/task/42/epoch/7")
	require.NoError(t, api.SetX509SVIDs([]*x509svid.SVID{other, rotated}, ca.Bundle()))
	want := rotated.Certificates[0].SerialNumber.String()
	waitFor(t, "the rotated own SVID", func() bool { return serialOf(t, src) == want })

	plain, err := FromWorkloadAPI(ctx, api.Addr())
	require.NoError(t, err)
	defer plain.Close()
	svid, err = plain.GetX509SVID()
	require.NoError(t, err, "without an identity to pick")
	require.Equal(t, other.ID, svid.ID, "without an identity to pick, want the first")
}
