package podworker_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/podworker"
)

func TestEnvNameRoundTrip(t *testing.T) {
	for _, prefix := range []string{"", "dynrunner-", "dynrunner-ci-"} {
		name := podworker.EnvName(prefix, 42, 7)
		assert.Equal(t, prefix+"42-7", name)
		task, epoch, ok := podworker.ParseEnvName(prefix, name)
		require.True(t, ok, name)
		assert.Equal(t, assignment.TaskID(42), task)
		assert.Equal(t, assignment.Epoch(7), epoch)
	}
}

func TestParseEnvNameRefusesOtherNames(t *testing.T) {
	for _, tc := range []struct{ prefix, name string }{
		{"dynrunner-", "dynrunner-42"},
		{"dynrunner-", "dynrunner-042-7"}, // not EnvName's spelling
		{"dynrunner-", "dynrunner-42-07"},
		{"dynrunner-", "dynrunner-0-7"},
		{"dynrunner-", "dynrunner-42-0"},
		{"dynrunner-", "dynrunner-ci-42-7"}, // another scope's
		{"dynrunner-ci-", "dynrunner-42-7"},
		{"dynrunner-", "other-42-7"},
		{"", "42-7-1"},
		{"", "../42-7"},
	} {
		_, _, ok := podworker.ParseEnvName(tc.prefix, tc.name)
		assert.False(t, ok, "prefix %q name %q", tc.prefix, tc.name)
	}
}

func TestLastErrorLine(t *testing.T) {
	log := "job output\n" +
		"  dynrunner executor: first failure  \n" +
		"dynrunner launcher: boot failed\n" +
		"more job output mentioning dynrunner executor: in the middle\n"
	got, err := podworker.LastErrorLine(strings.NewReader(log), 1<<20, podworker.ExecutorErrorPrefix)
	require.NoError(t, err)
	assert.Equal(t, "dynrunner executor: first failure", got)

	got, err = podworker.LastErrorLine(strings.NewReader(log), 1<<20, podworker.ExecutorErrorPrefix, podworker.LauncherErrorPrefix)
	require.NoError(t, err)
	assert.Equal(t, "dynrunner launcher: boot failed", got)

	// A line longer than the limit ends the scan; what came before still counts.
	long := "dynrunner executor: early\n" + strings.Repeat("x", 200) + "\ndynrunner executor: late\n"
	got, err = podworker.LastErrorLine(strings.NewReader(long), 100, podworker.ExecutorErrorPrefix)
	require.NoError(t, err)
	assert.Equal(t, "dynrunner executor: early", got)
}
