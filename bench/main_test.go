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
	// The restart benchmark re-runs it as the restarted controller, so its memory is measured
	// without the server's and the generator's.
	if os.Getenv(restartVar) != "" {
		os.Exit(restartMain())
	}
	// The memory benchmark's split variant re-runs it as the facade.
	if os.Getenv(facadeHostVar) != "" {
		os.Exit(facadeHostMain())
	}
	// The cluster benchmark runs it, in containers, as its controller replicas.
	if os.Getenv(planeHostVar) != "" {
		os.Exit(planeHostMain())
	}
	os.Exit(m.Run())
}
