package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

func TestRoute(t *testing.T) {
	pod := []assignment.Backend{assignment.BackendPod}
	both := []assignment.Backend{assignment.BackendPod, assignment.BackendVM}
	for _, tc := range []struct {
		name    string
		runsOn  []string
		enabled []assignment.Backend
		want    assignment.Backend
	}{
		{"pod", []string{"self-hosted", "pod"}, pod, assignment.BackendPod},
		{"pod alone", []string{"pod"}, pod, assignment.BackendPod},
		{"pod twice", []string{"self-hosted", "pod", "pod"}, pod, assignment.BackendPod},
		{"vm twice, padded", []string{" vm", "vm ", "self-hosted"}, both, assignment.BackendVM},
		{"vm enabled", []string{"self-hosted", "vm"}, both, assignment.BackendVM},
		{"vm not enabled", []string{"self-hosted", "vm"}, pod, ""},
		{"both", []string{"self-hosted", "pod", "vm"}, both, ""},
		{"no tier", []string{"self-hosted"}, both, ""},
		{"unknown", []string{"self-hosted", "pod", "ubuntu-latest"}, both, ""},
		{"empty", nil, both, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Route(tc.runsOn, tc.enabled)
			if tc.want == "" {
				if !errors.Is(err, ErrUnroutable) {
					t.Fatalf("Route = %q, %v; want ErrUnroutable", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Route = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// The message names what is accepted, every form Route takes, and quotes a flood of labels
// in bounded space.
func TestRouteMessages(t *testing.T) {
	_, err := Route([]string{"self-hosted"}, []assignment.Backend{assignment.BackendPod, assignment.BackendVM})
	if err == nil || !strings.HasSuffix(err.Error(), "accepted: [self-hosted, pod] or [pod]; [self-hosted, vm] or [vm]") {
		t.Fatalf("message %v", err)
	}
	flood := make([]string, 80000)
	for i := range flood {
		flood[i] = fmt.Sprintf("label-%d-%s", i, strings.Repeat("x", 100))
	}
	_, err = Route(flood, []assignment.Backend{assignment.BackendPod})
	if err == nil || len(err.Error()) > 2000 || !strings.Contains(err.Error(), "(79992 more)") {
		t.Fatalf("an 80,000-label runs-on gives a %d-byte message: %.300s", len(err.Error()), err)
	}
}

func TestParseJob(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		want          []string
		ok            bool
	}{
		{"list", "jobs:\n  a:\n    runs-on: [self-hosted, pod]\n", []string{"self-hosted", "pod"}, true},
		{"string", "jobs:\n  a:\n    runs-on: pod\n", []string{"pod"}, true},
		{"mapping", "jobs:\n  a:\n    runs-on:\n      group: g\n      labels: [self-hosted, vm]\n", []string{"self-hosted", "vm"}, true},
		{"two jobs", "jobs:\n  a:\n    runs-on: pod\n  b:\n    runs-on: pod\n", nil, false},
		{"garbage", "jobs: [", nil, false},
		{"nested labels", "jobs:\n  a:\n    runs-on:\n      labels: {x: y}\n", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseJob([]byte(tc.payload))
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && len(got.RunsOn) != len(tc.want) {
				t.Fatalf("runs-on = %v, want %v", got.RunsOn, tc.want)
			}
		})
	}
}

func FuzzParseJob(f *testing.F) {
	f.Add([]byte("jobs:\n  a:\n    runs-on: [self-hosted, pod]\n"))
	f.Add([]byte("jobs:\n  a:\n    runs-on:\n      labels: pod\n"))
	f.Fuzz(func(t *testing.T, payload []byte) {
		job, err := ParseJob(payload)
		if err != nil {
			return
		}
		// Whatever parses routes or fails cleanly; it never panics.
		_, _ = Route(job.RunsOn, []assignment.Backend{assignment.BackendPod})
	})
}
