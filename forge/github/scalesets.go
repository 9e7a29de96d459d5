package github

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/actions/scaleset"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

// LabelSelfHosted is the label every dynrunner scale set carries beside its tier's.
const LabelSelfHosted = "self-hosted"

// DefaultRunnerGroup is the runner group the scale sets are created in unless configured.
const DefaultRunnerGroup = "Default"

// ScaleSets names the scale sets: one per tier, called Prefix-<tier> (dynrunner-pod,
// dynrunner-vm), in RunnerGroup.
type ScaleSets struct {
	Prefix      string
	RunnerGroup string
	Tiers       []assignment.Backend
}

// Name is the scale set's name for tier.
func (s ScaleSets) Name(tier assignment.Backend) string { return s.Prefix + "-" + string(tier) }

// Labels are the labels of tier's scale set: self-hosted and the tier. A job reaches the scale
// set whose labels include all of its runs-on labels, so a job for [self-hosted, vm] can only
// ever reach the vm scale set.
func Labels(tier assignment.Backend) []scaleset.Label {
	return []scaleset.Label{{Type: "System", Name: LabelSelfHosted}, {Type: "System", Name: string(tier)}}
}

// Fits reports whether a job whose runs-on labels are labels is one set serves: it has labels,
// and each is the scale set's own (self-hosted, its tier, or its name, which GitHub also
// routes by), compared without case as GitHub does. The scale set's labels as dynrunner made
// them count, not as GitHub has them now: someone who added a label to the scale set in
// GitHub does not make its tier serve jobs of that label.
func Fits(labels []string, set ScaleSet) bool {
	if len(labels) == 0 {
		return false
	}
	for _, l := range labels {
		if !strings.EqualFold(l, LabelSelfHosted) && !strings.EqualFold(l, string(set.Tier)) &&
			(set.Name == "" || !strings.EqualFold(l, set.Name)) {
			return false
		}
	}
	return true
}

// ScaleSet is one tier's scale set as GitHub has it.
type ScaleSet struct {
	Tier assignment.Backend
	ID   int
	Name string
}

// EnsureScaleSets creates each tier's scale set, or adopts the one of that name in the runner
// group (a restart, another replica), setting its labels back to the tier's if someone changed
// them. Nothing else of an adopted scale set is changed.
func EnsureScaleSets(ctx context.Context, c *scaleset.Client, want ScaleSets) ([]ScaleSet, error) {
	group, err := c.GetRunnerGroupByName(ctx, want.RunnerGroup)
	if err != nil {
		return nil, fmt.Errorf("github: runner group %q: %w; create it in the organisation's Actions settings or set GITHUB_RUNNER_GROUP", want.RunnerGroup, err)
	}
	out := make([]ScaleSet, 0, len(want.Tiers))
	for _, tier := range want.Tiers {
		name := want.Name(tier)
		set, err := c.GetRunnerScaleSet(ctx, group.ID, name)
		if err != nil {
			return nil, fmt.Errorf("github: look up scale set %q: %w", name, err)
		}
		switch {
		case set == nil:
			set, err = c.CreateRunnerScaleSet(ctx, &scaleset.RunnerScaleSet{
				Name: name, RunnerGroupID: group.ID, Labels: Labels(tier),
				RunnerSetting: scaleset.RunnerSetting{DisableUpdate: true},
			})
			if err != nil {
				// Another replica may have made it in the meantime (GitHub refuses a second of
				// the name): adopt that one.
				again, gerr := c.GetRunnerScaleSet(ctx, group.ID, name)
				if gerr != nil || again == nil {
					return nil, fmt.Errorf("github: create scale set %q: %w", name, err)
				}
				set = again
			}
			if !sameLabels(set.Labels, Labels(tier)) {
				set.Labels = Labels(tier)
				if set, err = c.UpdateRunnerScaleSet(ctx, set.ID, set); err != nil {
					return nil, fmt.Errorf("github: set the labels of scale set %q back to %s+%s: %w", name, LabelSelfHosted, tier, err)
				}
			}
		case !sameLabels(set.Labels, Labels(tier)):
			set.Labels = Labels(tier)
			set, err = c.UpdateRunnerScaleSet(ctx, set.ID, set)
			if err != nil {
				return nil, fmt.Errorf("github: set the labels of scale set %q back to %s+%s: %w", name, LabelSelfHosted, tier, err)
			}
		}
		out = append(out, ScaleSet{Tier: tier, ID: set.ID, Name: name})
	}
	return out, nil
}

func sameLabels(have, want []scaleset.Label) bool {
	names := func(ls []scaleset.Label) []string {
		out := make([]string, 0, len(ls))
		for _, l := range ls {
			out = append(out, strings.ToLower(l.Name))
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(names(have), names(want))
}
