package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// LabelSelfHosted is the label every dynrunner job names besides its isolation label.
const LabelSelfHosted = "self-hosted"

// ErrUnroutable: a task's runs-on labels select no single enabled isolation tier.
var ErrUnroutable = errors.New("unroutable runs-on")

// JobInfo is what the scheduler reads from a task's workflow payload.
type JobInfo struct {
	ID     string
	Name   string
	RunsOn []string
}

// ParseJob reads the job of a Gitea task's workflow payload: a workflow with exactly one job
// whose `runs-on` Gitea has already evaluated.
func ParseJob(payload []byte) (JobInfo, error) {
	var wf struct {
		Jobs map[string]struct {
			Name   string    `yaml:"name"`
			RunsOn yaml.Node `yaml:"runs-on"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(payload, &wf); err != nil {
		return JobInfo{}, fmt.Errorf("scheduler: workflow payload: %w", err)
	}
	if len(wf.Jobs) != 1 {
		return JobInfo{}, fmt.Errorf("scheduler: workflow payload has %d jobs, want exactly 1", len(wf.Jobs))
	}
	for id, j := range wf.Jobs {
		labels, err := runsOn(&j.RunsOn)
		if err != nil {
			return JobInfo{}, fmt.Errorf("scheduler: job %q: %w", id, err)
		}
		return JobInfo{ID: id, Name: j.Name, RunsOn: labels}, nil
	}
	panic("unreachable")
}

// runsOn decodes the forms `runs-on` takes: a string, a list of strings, or a mapping with
// `labels` (and `group`, which Gitea does not use).
func runsOn(n *yaml.Node) ([]string, error) {
	switch n.Kind {
	case 0:
		return nil, nil
	case yaml.ScalarNode:
		return []string{n.Value}, nil
	case yaml.SequenceNode:
		var out []string
		if err := n.Decode(&out); err != nil {
			return nil, fmt.Errorf("runs-on: %w", err)
		}
		return out, nil
	case yaml.MappingNode:
		var m struct {
			Labels yaml.Node `yaml:"labels"`
		}
		if err := n.Decode(&m); err != nil {
			return nil, fmt.Errorf("runs-on: %w", err)
		}
		if m.Labels.Kind == yaml.MappingNode {
			return nil, errors.New("runs-on: labels must be a string or a list")
		}
		return runsOn(&m.Labels)
	}
	return nil, fmt.Errorf("runs-on: unsupported YAML kind %d", n.Kind)
}

// Route picks the isolation tier of a job: `pod` or `vm`, exactly one of them, and only a
// tier that is enabled. A label named twice counts once. Anything else is an ErrUnroutable
// whose message tells the workflow author what is accepted; it quotes at most a few of the
// job's labels, shortened, whatever the job sends. A job is never silently run with weaker
// isolation than it asked for.
func Route(runsOn []string, enabled []assignment.Backend) (assignment.Backend, error) {
	var tiers []assignment.Backend
	var unknown []string
	for _, l := range UniqueLabels(runsOn) {
		switch l {
		case LabelSelfHosted:
		case string(assignment.BackendPod):
			tiers = append(tiers, assignment.BackendPod)
		case string(assignment.BackendVM):
			tiers = append(tiers, assignment.BackendVM)
		default:
			unknown = append(unknown, l)
		}
	}
	accepted := acceptedLabels(enabled)
	asked := quoteLabels(runsOn)
	switch {
	case len(unknown) > 0:
		return "", fmt.Errorf("%w: runs-on %s names label(s) %s that dynrunner does not serve; accepted: %s", ErrUnroutable, asked, quoteLabels(unknown), accepted)
	case len(tiers) == 0:
		return "", fmt.Errorf("%w: runs-on %s names no isolation label; accepted: %s", ErrUnroutable, asked, accepted)
	case len(tiers) > 1:
		return "", fmt.Errorf("%w: runs-on %s names both pod and vm; a job runs in exactly one isolation tier; accepted: %s", ErrUnroutable, asked, accepted)
	case !slices.Contains(enabled, tiers[0]):
		return "", fmt.Errorf("%w: runs-on %s asks for %s, but no %s backend is enabled here (it never runs in another tier); accepted: %s", ErrUnroutable, asked, tiers[0], tiers[0], accepted)
	}
	return tiers[0], nil
}

// UniqueLabels returns the labels trimmed, each once, in the order they first appear: what a
// claim records of a job's runs-on.
func UniqueLabels(runsOn []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, l := range runsOn {
		l = strings.TrimSpace(l)
		if !seen[l] {
			seen[l] = true
			out = append(out, l)
		}
	}
	return out
}

// quoteLabels renders labels for a message: at most maxQuoted of them, each at most
// maxLabelLen bytes, and how many more there were.
func quoteLabels(labels []string) string {
	const maxQuoted, maxLabelLen = 8, 64
	shown := make([]string, 0, min(len(labels), maxQuoted))
	for i, l := range labels {
		if i == maxQuoted {
			break
		}
		if len(l) > maxLabelLen {
			l = strings.ToValidUTF8(l[:maxLabelLen], "") + "..."
		}
		shown = append(shown, l)
	}
	s := "[" + strings.Join(shown, ", ")
	if more := len(labels) - len(shown); more > 0 {
		s += fmt.Sprintf(", ... (%d more)", more)
	}
	return s + "]"
}

func acceptedLabels(enabled []assignment.Backend) string {
	var parts []string
	for _, b := range enabled {
		parts = append(parts, fmt.Sprintf("[%s, %s] or [%s]", LabelSelfHosted, b, b))
	}
	if len(parts) == 0 {
		return "none (no backend is enabled)"
	}
	return strings.Join(parts, "; ")
}
