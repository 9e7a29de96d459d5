package workloadtest

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Server is a fake Workload API server. Its methods are safe for concurrent use.
type Server struct {
	addr string
	grpc *grpc.Server
	wg   sync.WaitGroup
	once sync.Once

	mu      sync.Mutex
	svids   *workload.X509SVIDResponse    // nil: no identity
	bundles *workload.X509BundlesResponse // nil: no identity
	changed chan struct{}                 // closed and replaced on every Set
}

// Start starts a Server on a Unix socket in a new temporary directory and stops it when
// the test ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	// Not tb.TempDir: its paths can exceed the 108-byte limit of a socket path.
	dir, err := os.MkdirTemp("", "wlapi")
	if err != nil {
		tb.Fatalf("workloadtest: %v", err)
	}
	path := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		_ = os.RemoveAll(dir)
		tb.Fatalf("workloadtest: %v", err)
	}
	s := &Server{addr: "unix://" + path, grpc: grpc.NewServer(), changed: make(chan struct{})}
	workload.RegisterSpiffeWorkloadAPIServer(s.grpc, &handler{s: s})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.grpc.Serve(ln)
	}()
	tb.Cleanup(func() {
		s.Stop()
		_ = os.RemoveAll(dir)
	})
	return s
}

// Addr returns the address to give workloadapi.WithAddr, "unix:///...".
func (s *Server) Addr() string { return s.addr }

// Stop stops the server and ends open streams. It is idempotent.
func (s *Server) Stop() {
	s.once.Do(func() {
		s.grpc.Stop()
		s.wg.Wait()
	})
}

// SetX509SVID makes svid (with its bundle) the identity the server issues, and pushes it
// to every open stream. A nil svid removes the identity.
func (s *Server) SetX509SVID(svid *x509svid.SVID, bundle *x509bundle.Bundle) error {
	if svid == nil {
		return s.SetX509SVIDs(nil, bundle)
	}
	return s.SetX509SVIDs([]*x509svid.SVID{svid}, bundle)
}

// SetX509SVIDs makes svids, in this order, the identities the server issues (as an agent
// does for a workload several entries select), and pushes them to every open stream. No
// svids removes the identity.
func (s *Server) SetX509SVIDs(list []*x509svid.SVID, bundle *x509bundle.Bundle) error {
	var (
		svids   *workload.X509SVIDResponse
		bundles *workload.X509BundlesResponse
	)
	if len(list) > 0 {
		if bundle == nil {
			return errors.New("workloadtest: svid without bundle")
		}
		bundleDER := concatDER(bundle.X509Authorities())
		svids = &workload.X509SVIDResponse{}
		for _, svid := range list {
			keyDER, err := x509.MarshalPKCS8PrivateKey(svid.PrivateKey)
			if err != nil {
				return err
			}
			svids.Svids = append(svids.Svids, &workload.X509SVID{
				SpiffeId:    svid.ID.String(),
				X509Svid:    concatDER(svid.Certificates),
				X509SvidKey: keyDER,
				Bundle:      bundleDER,
				Hint:        svid.Hint,
			})
		}
		bundles = &workload.X509BundlesResponse{Bundles: map[string][]byte{
			bundle.TrustDomain().IDString(): bundleDER,
		}}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.svids, s.bundles = svids, bundles
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

func concatDER(certs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, c.Raw...)
	}
	return out
}

type handler struct {
	workload.UnimplementedSpiffeWorkloadAPIServer
	s *Server
}

func checkHeader(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("workload.spiffe.io"); len(v) != 1 || v[0] != "true" {
		return status.Error(codes.InvalidArgument, "security header missing from request")
	}
	return nil
}

// stream sends pick's current response and every change until the stream ends.
func stream[T any](ctx context.Context, s *Server, pick func(*Server) *T, send func(*T) error) error {
	if err := checkHeader(ctx); err != nil {
		return err
	}
	for {
		s.mu.Lock()
		resp, changed := pick(s), s.changed
		s.mu.Unlock()
		if resp == nil {
			return status.Error(codes.PermissionDenied, "no identity issued")
		}
		if err := send(resp); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

func (h *handler) FetchX509SVID(_ *workload.X509SVIDRequest, srv workload.SpiffeWorkloadAPI_FetchX509SVIDServer) error {
	return stream(srv.Context(), h.s, func(s *Server) *workload.X509SVIDResponse { return s.svids }, srv.Send)
}

func (h *handler) FetchX509Bundles(_ *workload.X509BundlesRequest, srv workload.SpiffeWorkloadAPI_FetchX509BundlesServer) error {
	return stream(srv.Context(), h.s, func(s *Server) *workload.X509BundlesResponse { return s.bundles }, srv.Send)
}
