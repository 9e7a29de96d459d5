package workload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/dynrunner/dynrunner/internal/secretfile"
)

// Source yields the workload's current X.509-SVID and the X.509 bundles that verify its
// peers. Close releases it; it is idempotent, and the getters fail afterwards.
type Source interface {
	x509svid.Source
	x509bundle.Source
	io.Closer
}

var _ Source = (*workloadapi.X509Source)(nil)

// File names in an SVID directory, as spiffe-helper writes them by default.
const (
	SVIDFile    = "svid.pem"     // the SVID certificate chain, leaf first, PEM
	SVIDKeyFile = "svid_key.pem" // the SVID's private key, PKCS#8 PEM, mode 0600
	BundleFile  = "bundle.pem"   // the trust domain's X.509 authorities, PEM
)

// ErrClosed reports a use of a Source after Close.
var ErrClosed = errors.New("source is closed")

// FromWorkloadAPI connects to the SPIFFE Workload API at socketAddr ("unix:///path" or
// "tcp://ip:port") and waits until it has issued this workload's first X.509-SVID, or
// until ctx ends. The returned Source follows rotations until it is closed; ctx bounds
// only the wait.
func FromWorkloadAPI(ctx context.Context, socketAddr string) (Source, error) {
	return FromWorkloadAPIFor(ctx, socketAddr, spiffeid.ID{})
}

// FromWorkloadAPIFor is FromWorkloadAPI for a workload that may be issued several SVIDs (it
// matches several registration entries): the Source serves the SVID for id whenever the
// Workload API issues one, and the first one otherwise; a zero id takes the first always.
// Without it, a Workload API listing another identity first would make that one the
// workload's identity, now or at a later rotation.
func FromWorkloadAPIFor(ctx context.Context, socketAddr string, id spiffeid.ID) (Source, error) {
	if err := workloadapi.ValidateAddress(socketAddr); err != nil {
		return nil, fmt.Errorf("workload: workload api address %q: %w", socketAddr, err)
	}
	opts := []workloadapi.X509SourceOption{workloadapi.WithClientOptions(workloadapi.WithAddr(socketAddr))}
	if !id.IsZero() {
		opts = append(opts, workloadapi.WithDefaultX509SVIDPicker(func(svids []*x509svid.SVID) *x509svid.SVID {
			for _, s := range svids {
				if s.ID == id {
					return s
				}
			}
			return svids[0]
		}))
	}
	src, err := workloadapi.NewX509Source(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("workload: wait for svid from workload api %s: %w", socketAddr, err)
	}
	return src, nil
}

// FromFiles waits until dir holds SVIDFile, SVIDKeyFile and BundleFile, polling every poll
// (250ms if poll <= 0) until ctx ends, and returns a Source over them. The key file is read
// with secretfile and must not be accessible by other users; that is reported at once,
// while missing or unparsable files are waited for. The Source reloads the files when they
// are replaced (checked at each use); until a replacement parses, it keeps the last SVID.
// The trust domain of the bundle is the SVID's.
func FromFiles(ctx context.Context, dir string, poll time.Duration) (Source, error) {
	if poll <= 0 {
		poll = 250 * time.Millisecond
	}
	s := &fileSource{dir: dir}
	var tick *time.Ticker
	for {
		err := s.load()
		if err == nil {
			return s, nil
		}
		if errors.Is(err, secretfile.ErrPermissions) || errors.Is(err, secretfile.ErrNotRegular) {
			return nil, err
		}
		if tick == nil {
			tick = time.NewTicker(poll)
			defer tick.Stop()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("workload: wait for svid files in %s: %w (last: %w)", dir, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// sameFile reports whether b is the file a was, unchanged: replacing a file (as
// WriteSVIDFiles and spiffe-helper do) or writing to it changes the result.
func sameFile(a, b fs.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}

type fileSource struct {
	dir string

	closable
	svid   *x509svid.SVID
	bundle *x509bundle.Bundle
	stamps [3]fs.FileInfo // of the files last loaded
}

var fileNames = [3]string{SVIDFile, SVIDKeyFile, BundleFile}

// load reads the three files if any of them changed since the last load.
// It is called with s.mu held or before s is shared.
func (s *fileSource) load() error {
	var infos [3]fs.FileInfo
	changed := s.svid == nil
	for i, name := range fileNames {
		fi, err := os.Stat(filepath.Join(s.dir, name))
		if err != nil {
			return fmt.Errorf("workload: %w", err)
		}
		infos[i] = fi
		if !sameFile(s.stamps[i], fi) {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	certPEM, err := os.ReadFile(filepath.Join(s.dir, SVIDFile))
	if err != nil {
		return fmt.Errorf("workload: %w", err)
	}
	keyPEM, err := secretfile.Read(filepath.Join(s.dir, SVIDKeyFile))
	if err != nil {
		return fmt.Errorf("workload: svid key: %w", err)
	}
	defer clear(keyPEM)
	svid, err := x509svid.Parse(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("workload: svid in %s: %w", s.dir, err)
	}
	bundlePEM, err := os.ReadFile(filepath.Join(s.dir, BundleFile))
	if err != nil {
		return fmt.Errorf("workload: %w", err)
	}
	bundle, err := x509bundle.Parse(svid.ID.TrustDomain(), bundlePEM)
	if err != nil {
		return fmt.Errorf("workload: bundle in %s: %w", s.dir, err)
	}
	if bundle.Empty() {
		return fmt.Errorf("workload: bundle in %s holds no authority", s.dir)
	}
	s.svid, s.bundle = svid, bundle
	s.stamps = infos
	return nil
}

// GetX509SVID implements x509svid.Source.
func (s *fileSource) GetX509SVID() (*x509svid.SVID, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	_ = s.load() // keep the current SVID until a replacement parses
	return s.svid, nil
}

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (s *fileSource) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if err := s.lock(); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	_ = s.load()
	if td != s.bundle.TrustDomain() {
		return nil, fmt.Errorf("workload: no bundle for trust domain %q", td)
	}
	return s.bundle, nil
}

// WriteSVIDFiles writes svid and bundle to dir as BundleFile, SVIDKeyFile and SVIDFile (in
// that order, the certificate last), each atomically with mode 0600; dir is created with
// mode 0700. A FromFiles Source reading dir picks the new files up.
func WriteSVIDFiles(dir string, svid *x509svid.SVID, bundle *x509bundle.Bundle) error {
	if svid == nil || bundle == nil {
		return errors.New("workload: write svid files: nil svid or bundle")
	}
	certPEM, keyPEM, err := svid.Marshal()
	if err != nil {
		return fmt.Errorf("workload: write svid files: %w", err)
	}
	defer clear(keyPEM)
	bundlePEM, err := bundle.Marshal()
	if err != nil {
		return fmt.Errorf("workload: write svid files: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{BundleFile, bundlePEM},
		{SVIDKeyFile, keyPEM},
		{SVIDFile, certPEM},
	} {
		if err := secretfile.WriteNew(filepath.Join(dir, f.name), f.data); err != nil {
			return fmt.Errorf("workload: write svid files: %w", err)
		}
	}
	return nil
}

// closable is the lock and the closed flag of a Source, shared by the file and the
// development-CA sources.
type closable struct {
	mu     sync.Mutex
	closed bool
}

// lock takes the lock, or returns ErrClosed without it once Close was called.
func (c *closable) lock() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("workload: %w", ErrClosed)
	}
	return nil
}

// Close implements io.Closer: every later read of the source returns ErrClosed.
func (c *closable) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}
