//go:build linux

package local

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

func TestProcRefAliveSelf(t *testing.T) {
	st, err := readStat(os.Getpid())
	require.NoError(t, err)
	ref := procRef{pid: os.Getpid(), pgid: os.Getpid(), start: st.Start}
	assert.True(t, ref.alive(), "alive(self)")
	ref.start++
	assert.False(t, ref.alive(), "alive(self with another start time)")
}

func TestEnvIDs(t *testing.T) {
	tests := []struct {
		id    string
		task  assignment.TaskID
		epoch assignment.Epoch
		ok    bool
	}{
		{"1-1", 1, 1, true},
		{"9223372036854775807-18446744073709551615", 9223372036854775807, 18446744073709551615, true},
		{"0-1", 0, 0, false},
		{"1-0", 0, 0, false},
		{"01-1", 0, 0, false},
		{"1-1-1", 0, 0, false},
		{"junk", 0, 0, false},
		{"-1-1", 0, 0, false},
	}
	for _, tt := range tests {
		task, epoch, ok := parseEnvID(tt.id)
		assert.Equal(t, tt.task, task, "parseEnvID(%q)", tt.id)
		assert.Equal(t, tt.epoch, epoch, "parseEnvID(%q)", tt.id)
		assert.Equal(t, tt.ok, ok, "parseEnvID(%q)", tt.id)
		if ok {
			assert.Equal(t, tt.id, envID(task, epoch))
		}
	}
}

func FuzzEnvID(f *testing.F) {
	f.Add("1-1")
	f.Add("12-x")
	f.Fuzz(func(t *testing.T, id string) {
		task, epoch, ok := parseEnvID(id)
		if !ok {
			return
		}
		assert.Equal(t, id, envID(task, epoch), "parseEnvID(%q) = %d, %d", id, task, epoch)
		assert.True(t, validName(id, false), "environment id %q is not a valid name", id)
	})
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"token": true, "svid.pem": true, ".hidden": false, "": false, ".": false, "..": false,
		"a/b": false, "a..b": false, "nul\x00": false, string(make([]byte, 256)): false,
	} {
		assert.Equal(t, want, validName(name, false), "validName(%q)", name)
	}
	assert.True(t, validName(".hidden", true), `validName(".hidden", dots)`)
}

func TestRefFromData(t *testing.T) {
	ref := procRef{pid: 10, pgid: 10, start: 99}
	got, ok, err := refFromData(ref.data("/x"))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, ref, got)
	_, ok, err = refFromData(nil)
	require.NoError(t, err, "refFromData(nil): no process, no error")
	assert.False(t, ok, "refFromData(nil): no process")
	for _, d := range []map[string]string{
		{dataPID: "1", dataPGID: "1", dataStartTime: "5"},
		{dataPID: "10", dataPGID: "11", dataStartTime: "5"},
		{dataPID: "10", dataPGID: "10"},
		{dataPID: "ten", dataPGID: "10", dataStartTime: "5"},
	} {
		_, _, err := refFromData(d)
		assert.Error(t, err, "refFromData(%v)", d)
	}
}
