package fleet_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/fleet"
)

// TestAutoscaleEndpoint: GET /v1/fleet/autoscale answers the decision per tier as JSON, and 503
// with the reason when the fleet cannot be read; the gauges carry the same decision.
func TestAutoscaleEndpoint(t *testing.T) {
	r := fleet.Build(nil, []assignment.State{{Record: assignment.Record{Backend: assignment.BackendPod, Phase: assignment.Queued}}}, time.Now())
	r.Autoscale = r.Decisions(map[assignment.Backend]int{assignment.BackendPod: 4})
	ok := func(context.Context) (fleet.Report, error) { return r, nil }
	rec := httptest.NewRecorder()
	fleet.AutoscaleHandler(ok).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/fleet/autoscale", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, rec.Body.String(), `"pod":{"queued":1,"in_flight":0,"workers":0,"slots":0,"draining":0,"draining_in_flight":0,"per_worker":4,"desired_workers":1,"reason":"1 queued, 0 in flight, 0 workers of 0 slots online: want 1 more"}`)

	bad := func(context.Context) (fleet.Report, error) { return fleet.Report{}, errors.New("nats: timeout") }
	rec = httptest.NewRecorder()
	fleet.AutoscaleHandler(bad).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/fleet/autoscale", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Contains(t, rec.Body.String(), "nats: timeout")

	reg := prometheus.NewRegistry()
	reg.MustRegister(fleet.NewAutoscaleCollector(ok))
	n, err := testutil.GatherAndCount(reg, "dynrunner_autoscale_desired_workers")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP dynrunner_autoscale_desired_workers Workers the tier wants (not counting draining ones): its queued and in-flight work over one worker's capacity, 0 when idle. The same as GET /v1/fleet/autoscale.
# TYPE dynrunner_autoscale_desired_workers gauge
dynrunner_autoscale_desired_workers{backend="pod"} 1
`), "dynrunner_autoscale_desired_workers"))
}
