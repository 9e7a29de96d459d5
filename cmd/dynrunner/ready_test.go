package main

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadyzNamesWhatItWaitsFor: a controller that is not ready yet says which components it
// waits for, so an operator whose rolling restart stalls knows where to look.
func TestReadyzNamesWhatItWaitsFor(t *testing.T) {
	done, open := make(chan struct{}), make(chan struct{})
	close(done)
	p := &plane{ready: []readyWait{{"the view", done}, {"the scheduler", open}}}
	var isReady atomic.Bool
	h := readyHandler(&isReady, p.unready, nil)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	assert.Equal(t, "not ready: waiting for the scheduler\n", rec.Body.String())

	close(open)
	assert.Empty(t, p.unready())
}
