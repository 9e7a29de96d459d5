package config

import (
	"strings"
	"testing"
)

func TestLoadLocalPodBackend(t *testing.T) {
	with := func(kv ...string) map[string]string {
		m := base()
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	c, err := LoadController(envOf(with()))
	if err != nil {
		t.Fatal(err)
	}
	if want := (LocalPod{UIDBase: 2_000_000_000, UIDCount: 65536}); c.Local != want {
		t.Errorf("local defaults: %+v, want %+v", c.Local, want)
	}
	c, err = LoadController(envOf(with("POD_LOCAL_UID_BASE", "100000", "POD_LOCAL_UID_COUNT", "8")))
	if err != nil {
		t.Fatal(err)
	}
	if want := (LocalPod{UIDBase: 100000, UIDCount: 8}); c.Local != want {
		t.Errorf("local settings: %+v, want %+v", c.Local, want)
	}
	for _, tt := range []struct {
		name string
		kv   []string
		want string
	}{
		{"uid 0", []string{"POD_LOCAL_UID_BASE", "0"}, "uid 0 is root"},
		{"not a number", []string{"POD_LOCAL_UID_BASE", "-5"}, "POD_LOCAL_UID_BASE"},
		{"too few for the concurrency", []string{"POD_LOCAL_UID_COUNT", "2", "POD_CONCURRENCY", "3"}, "below POD_CONCURRENCY"},
		{"empty range", []string{"POD_LOCAL_UID_COUNT", "0"}, "below POD_CONCURRENCY"},
		{"past the end", []string{"POD_LOCAL_UID_BASE", "4294967290", "POD_LOCAL_UID_COUNT", "10"}, "past the last uid"},
		{"nobody", []string{"POD_LOCAL_UID_BASE", "60000", "POD_LOCAL_UID_COUNT", "10000"}, "nobody"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadController(envOf(with(tt.kv...)))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("LoadController(%v) = %v, want an error naming %q", tt.kv, err, tt.want)
			}
		})
	}
	// Another backend does not check the range.
	m := with("POD_LOCAL_UID_BASE", "0", "POD_BACKEND", "docker", "POD_EXECUTOR_IMAGE", "sha256:"+strings.Repeat("0f", 32))
	delete(m, "GITEA_RUNNER_BIN")
	if _, err := LoadController(envOf(m)); err != nil {
		t.Errorf("docker backend with POD_LOCAL_UID_BASE=0: %v", err)
	}
}
