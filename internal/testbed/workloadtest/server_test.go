package workloadtest_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/dynrunner/dynrunner/internal/testbed/workloadtest"
	dynworkload "github.com/dynrunner/dynrunner/internal/workload"
)

func dial(t *testing.T, addr string) workload.SpiffeWorkloadAPIClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return workload.NewSpiffeWorkloadAPIClient(conn)
}

func withHeader(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "workload.spiffe.io", "true")
}

func TestServer(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("ci.example.org")
	ca, err := dynworkload.LoadOrCreateDevCA(filepath.Join(t.TempDir(), "ca"), td)
	require.NoError(t, err)
	svid, err := ca.Issue(dynworkload.AssignmentID(td, 42, 7), time.Hour)
	require.NoError(t, err)
	api := workloadtest.Start(t)
	client := dial(t, api.Addr())

	recvX509 := func(ctx context.Context) (*workload.X509SVIDResponse, error) {
		stream, err := client.FetchX509SVID(ctx, &workload.X509SVIDRequest{})
		if err != nil {
			return nil, err
		}
		return stream.Recv()
	}
	recvBundles := func(ctx context.Context) (*workload.X509BundlesResponse, error) {
		stream, err := client.FetchX509Bundles(ctx, &workload.X509BundlesRequest{})
		if err != nil {
			return nil, err
		}
		return stream.Recv()
	}

	tests := []struct {
		name     string
		header   bool
		identity bool
		wantCode codes.Code
	}{
		{name: "no security header", header: false, identity: true, wantCode: codes.InvalidArgument},
		{name: "no identity issued", header: true, identity: false, wantCode: codes.PermissionDenied},
		{name: "identity", header: true, identity: true, wantCode: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.identity {
				err = api.SetX509SVID(svid, ca.Bundle())
			} else {
				err = api.SetX509SVID(nil, nil)
			}
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if tt.header {
				ctx = withHeader(ctx)
			}
			resp, err := recvX509(ctx)
			require.Equal(t, tt.wantCode, status.Code(err), "FetchX509SVID code = %v (%v), want %v", status.Code(err), err, tt.wantCode)
			bundles, err := recvBundles(ctx)
			require.Equal(t, tt.wantCode, status.Code(err), "FetchX509Bundles code = %v (%v), want %v", status.Code(err), err, tt.wantCode)
			if tt.wantCode != codes.OK {
				return
			}
			require.Len(t, resp.Svids, 1, "response SVIDs = %v, want one for %s", resp.Svids, svid.ID)
			require.Equal(t, svid.ID.String(), resp.Svids[0].SpiffeId, "response SVID id")
			got, err := x509svid.ParseRaw(resp.Svids[0].X509Svid, resp.Svids[0].X509SvidKey)
			require.NoError(t, err, "response SVID does not parse")
			assert.True(t, got.Certificates[0].Equal(svid.Certificates[0]), "response SVID differs from the one set")
			assert.Contains(t, bundles.Bundles, td.IDString(), "bundles response")
		})
	}

	t.Run("jwt is unimplemented", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(withHeader(t.Context()), 10*time.Second)
		defer cancel()
		_, err := client.FetchJWTSVID(ctx, &workload.JWTSVIDRequest{Audience: []string{"x"}})
		require.Equal(t, codes.Unimplemented, status.Code(err), "FetchJWTSVID code = %v, want Unimplemented", status.Code(err))
	})

	t.Run("stop ends streams", func(t *testing.T) {
		require.NoError(t, api.SetX509SVID(svid, ca.Bundle()))
		ctx, cancel := context.WithTimeout(withHeader(t.Context()), 10*time.Second)
		defer cancel()
		stream, err := client.FetchX509SVID(ctx, &workload.X509SVIDRequest{})
		require.NoError(t, err)
		_, err = stream.Recv()
		require.NoError(t, err)
		api.Stop()
		api.Stop() // idempotent
		_, err = stream.Recv()
		require.Error(t, err, "stream still open after Stop")
	})
}
