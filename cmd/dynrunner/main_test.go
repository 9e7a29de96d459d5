package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestControllerRefusesUnsafeBoot runs the controller entry point with configurations that
// must not boot and checks the message tells the operator what to fix.
func TestControllerRefusesUnsafeBoot(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "loose.key")
	if err := os.WriteFile(loose, []byte(strings.Repeat("k", 48)), 0o644); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short.key")
	if err := os.WriteFile(short, []byte("too-short"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "good.key")
	if err := os.WriteFile(good, []byte(strings.Repeat("g", 48)), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{
		"STATE_DIR":           filepath.Join(dir, "state"),
		"GITEA_URL":           "http://127.0.0.1:1",
		"GITEA_RUNNER_BIN":    "/bin/true",
		"GITEA_RUNNER_SHA256": strings.Repeat("0", 64),
		"NATS_URL":            "nats://127.0.0.1:1",
	}
	for _, tc := range []struct {
		name string
		set  map[string]string
		want string
	}{
		{"world-readable capability key", map[string]string{"RUNNER_FACADE_CAPABILITY_KEY_FILE": loose, "TASK_ENCRYPTION_KEY_FILE": good}, "chmod 600"},
		{"short capability key", map[string]string{"RUNNER_FACADE_CAPABILITY_KEY_FILE": short, "TASK_ENCRYPTION_KEY_FILE": good}, "at least 32"},
		{"missing task key file", map[string]string{"RUNNER_FACADE_CAPABILITY_KEY_FILE": good, "TASK_ENCRYPTION_KEY_FILE": filepath.Join(dir, "nope")}, "TASK_ENCRYPTION_KEY_FILE"},
		{"half-configured runner credentials", map[string]string{"RUNNER_FACADE_CAPABILITY_KEY_FILE": good, "TASK_ENCRYPTION_KEY_FILE": good, "GITEA_RUNNER_UUID_FILE": good}, "GITEA_RUNNER_TOKEN_FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range base {
				t.Setenv(k, v)
			}
			for k, v := range tc.set {
				t.Setenv(k, v)
			}
			err := runController(t.Context(), nil)
			if err == nil {
				t.Fatal("the controller booted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), strings.Repeat("g", 48)) || strings.Contains(err.Error(), strings.Repeat("k", 48)) {
				t.Fatal("the error shows a key")
			}
		})
	}
}
