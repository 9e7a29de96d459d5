package scheduler

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

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
			assert.Equal(t, tc.want, got)
			if tc.want == "" {
				require.ErrorIs(t, err, ErrUnroutable)
				return
			}
			require.NoError(t, err)
		})
	}
}

// The message names what is accepted, every form Route takes, and quotes a flood of labels
// in bounded space.
func TestRouteMessages(t *testing.T) {
	_, err := Route([]string{"self-hosted"}, []assignment.Backend{assignment.BackendPod, assignment.BackendVM})
	require.Error(t, err)
	assert.True(t, strings.HasSuffix(err.Error(), "accepted: [self-hosted, pod] or [pod]; [self-hosted, vm] or [vm]"), "message %v", err)
	flood := make([]string, 80000)
	for i := range flood {
		flood[i] = fmt.Sprintf("label-%d-%s", i, strings.Repeat("x", 100))
	}
	_, err = Route(flood, []assignment.Backend{assignment.BackendPod})
	require.Error(t, err)
	assert.LessOrEqual(t, len(err.Error()), 2000, "an 80,000-label runs-on gives a long message: %.300s", err)
	assert.Contains(t, err.Error(), "(79992 more)")
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
			if !tc.ok {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.RunsOn)
			assert.Equal(t, "a", got.ID)
		})
	}
}

func FuzzParseJob(f *testing.F) {
	f.Add([]byte("jobs:\n  a:\n    runs-on: [self-hosted, pod]\n"), "self-hosted\x00pod")
	f.Add([]byte("jobs:\n  a:\n    runs-on:\n      labels: pod\n"), "vm\x00 vm \x00self-hosted")
	f.Add([]byte("jobs: {a: {runs-on: [pod, vm]}}"), "pod\x00vm")
	f.Add([]byte("jobs: ["), "")
	f.Add([]byte("jobs: {a: {runs-on: pod}, b: {runs-on: pod}}"), "x")
	f.Add([]byte("jobs: {a: {runs-on: {labels: {x: y}}}}"), "vm")
	f.Fuzz(func(t *testing.T, payload []byte, labelList string) {
		enabled := []assignment.Backend{assignment.BackendPod, assignment.BackendVM}
		// Whatever a payload holds, parsing it is deterministic, a refusal says it is the
		// scheduler's reading of the workflow payload, and routing an accepted job agrees with
		// the reference and its refusal is bounded, whatever the labels.
		job, err := ParseJob(payload)
		again, err2 := ParseJob(payload)
		assert.Equal(t, job, again)
		assert.Equal(t, err, err2)
		if err != nil {
			assert.Zero(t, job)
			assert.True(t, strings.HasPrefix(err.Error(), "scheduler: workflow payload") || strings.HasPrefix(err.Error(), "scheduler: job "),
				"refusal %q does not say what it refused", err)
		} else {
			// The one job it names is in the payload, under that id.
			var wf struct {
				Jobs map[string]any `yaml:"jobs"`
			}
			require.NoError(t, yaml.Unmarshal(payload, &wf))
			require.Len(t, wf.Jobs, 1)
			assert.Contains(t, wf.Jobs, job.ID)
			checkRoute(t, job.RunsOn, enabled)
			checkRoute(t, job.RunsOn, enabled[:1])
		}
		// Round trip: a workflow naming labels parses back to exactly those labels, in each
		// form runs-on takes (a list, and a mapping's labels), under the job's id and name.
		labels := strings.Split(labelList, "\x00")
		if !utf8.ValidString(labelList) {
			return // YAML holds text only
		}
		for _, runsOn := range []any{labels, map[string]any{"group": "g", "labels": labels}} {
			wf, err := yaml.Marshal(map[string]any{"jobs": map[string]any{"build": map[string]any{"name": labelList, "runs-on": runsOn}}})
			require.NoError(t, err)
			var generic any
			if yaml.Unmarshal(wf, &generic) != nil {
				return // yaml.v3 emits some block scalars it cannot read back
			}
			job, err := ParseJob(wf)
			require.NoError(t, err, "%s", wf)
			assert.Equal(t, JobInfo{ID: "build", Name: labelList, RunsOn: labels}, job, "%s", wf)
			checkRoute(t, job.RunsOn, enabled)
		}
		// A single label is also written as a plain string.
		wf, err := yaml.Marshal(map[string]any{"jobs": map[string]any{"build": map[string]any{"runs-on": labels[0]}}})
		require.NoError(t, err)
		var generic any
		if yaml.Unmarshal(wf, &generic) != nil {
			return
		}
		job, err = ParseJob(wf)
		require.NoError(t, err, "%s", wf)
		assert.Equal(t, []string{labels[0]}, job.RunsOn, "%s", wf)
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

// TestForkOf: which tasks run for a pull request from a fork; a pull request event that does
// not say where its head is counts as one (fail closed).
func TestForkOf(t *testing.T) {
	repo := func(name string) map[string]any { return map[string]any{"repo": map[string]any{"full_name": name}} }
	for _, tc := range []struct {
		name  string
		event string
		pr    map[string]any
		want  bool
	}{
		{"push", "push", nil, false},
		{"pull request from a branch", "pull_request", map[string]any{"head": repo("o/r"), "base": repo("o/r")}, false},
		{"names compare without case", "pull_request", map[string]any{"head": repo("O/R"), "base": repo("o/r")}, false},
		{"pull request from a fork", "pull_request", map[string]any{"head": repo("stranger/r"), "base": repo("o/r")}, true},
		{"pull_request_target from a fork", "pull_request_target", map[string]any{"head": repo("stranger/r"), "base": repo("o/r")}, true},
		{"review comment on a fork's pull request", "pull_request_review_comment", map[string]any{"head": repo("stranger/r"), "base": repo("o/r")}, true},
		{"head repository deleted", "pull_request", map[string]any{"head": map[string]any{}, "base": repo("o/r")}, true},
		{"no pull request in the event", "pull_request", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fields := map[string]any{"repository": "o/r", "event_name": tc.event}
			if tc.pr != nil {
				fields["event"] = map[string]any{"pull_request": tc.pr}
			}
			ctx, err := structpb.NewStruct(fields)
			require.NoError(t, err)
			assert.Equal(t, tc.want, forkOf(&runnerv1.Task{Context: ctx}))
		})
	}
}
