package main

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/workload"
)

// switchingSource serves first's SVID for the first calls, then second's, as a Workload API
// does when the identity of the caller changes.
type switchingSource struct {
	workload.Source
	second workload.Source
	calls  atomic.Int32
	after  int32
}

func (s *switchingSource) GetX509SVID() (*x509svid.SVID, error) {
	if s.calls.Add(1) > s.after {
		return s.second.GetX509SVID()
	}
	return s.Source.GetX509SVID()
}

// TestWaitOwnSVID: the executor waits through another identity until the Workload API serves
// its own, and names the other identity when its own never comes.
func TestWaitOwnSVID(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("exec.test")
	ca, err := workload.LoadOrCreateDevCA(t.TempDir(), td)
	require.NoError(t, err)
	other, err := ca.Source(workload.AssignmentID(td, 9, 1), time.Hour)
	require.NoError(t, err)
	own, err := ca.Source(workload.AssignmentID(td, 7, 3), time.Hour)
	require.NoError(t, err)
	src := &switchingSource{Source: other, second: own, after: 3}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	svid, err := waitOwnSVID(ctx, src, td, 7, 3)
	require.NoError(t, err)
	assert.Equal(t, workload.AssignmentID(td, 7, 3), svid.ID)
	assert.Greater(t, src.calls.Load(), int32(3), "returned before its own SVID was served")

	short, cancel2 := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel2()
	_, err = waitOwnSVID(short, other, td, 7, 3)
	assert.ErrorContains(t, err, "spiffe://exec.test/dynrunner/task/9/epoch/1 is not the identity of task 7 epoch 3")
}
