package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

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
	f.Add([]byte("jobs:\n  a:\n    runs-on: [self-hosted, pod]\n"), "self-hosted\x00pod")
	f.Add([]byte("jobs:\n  a:\n    runs-on:\n      labels: pod\n"), "vm\x00 vm \x00self-hosted")
	f.Add([]byte("jobs: {a: {runs-on: [pod, vm]}}"), "pod\x00vm")
	f.Fuzz(func(t *testing.T, payload []byte, labelList string) {
		enabled := []assignment.Backend{assignment.BackendPod, assignment.BackendVM}
		// Whatever a payload holds, routing it agrees with the reference and its refusal is
		// bounded, whatever the labels.
		if job, err := ParseJob(payload); err == nil {
			checkRoute(t, job.RunsOn, enabled)
			checkRoute(t, job.RunsOn, enabled[:1])
		}
		// Round trip: a workflow naming labels parses back to exactly those labels.
		labels := strings.Split(labelList, "\x00")
		wf, err := yaml.Marshal(map[string]any{"jobs": map[string]any{"build": map[string]any{"runs-on": labels}}})
		require.NoError(t, err)
		var generic any
		if !utf8.ValidString(labelList) || yaml.Unmarshal(wf, &generic) != nil {
			return // YAML holds text only; and yaml.v3 emits some block scalars it cannot read back
		}
		job, err := ParseJob(wf)
		require.NoError(t, err, "%s", wf)
		assert.Equal(t, labels, job.RunsOn)
		checkRoute(t, job.RunsOn, enabled)
	})
}

// checkRoute compares Route with a reference: the trimmed labels, each once, must all be
// self-hosted, pod or vm, with exactly one of pod and vm, and that one enabled. A refusal is an
// ErrUnroutable of bounded length.
func checkRoute(t *testing.T, runsOn []string, enabled []assignment.Backend) {
	t.Helper()
	var tiers []assignment.Backend
	valid := true
	seen := map[string]bool{}
	for _, l := range runsOn {
		l = strings.TrimSpace(l)
		if seen[l] {
			continue
		}
		seen[l] = true
		switch l {
		case "self-hosted":
		case "pod", "vm":
			tiers = append(tiers, assignment.Backend(l))
		default:
			valid = false
		}
	}
	want := assignment.Backend("")
	if valid && len(tiers) == 1 && slices.Contains(enabled, tiers[0]) {
		want = tiers[0]
	}
	got, err := Route(runsOn, enabled)
	assert.Equal(t, want, got, "runs-on %q", runsOn)
	if want == "" {
		require.ErrorIs(t, err, ErrUnroutable)
		assert.Less(t, len(err.Error()), 2048, "a refusal quotes labels in bounded space")
	} else {
		require.NoError(t, err)
	}
}
