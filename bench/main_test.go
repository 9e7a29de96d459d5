package bench

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// The memory benchmark re-runs this binary as the host of its environments, so that their
	// client side stays out of the controller's memory.
	if os.Getenv(envHostVar) != "" {
		os.Exit(envHostMain())
	}
	os.Exit(m.Run())
}
