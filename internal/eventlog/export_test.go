package eventlog

import "time"

// SetLivePassEvery makes following views check the live index every d, for a test.
func SetLivePassEvery(d time.Duration) (restore func()) {
	old := livePassEvery
	livePassEvery = d
	return func() { livePassEvery = old }
}
