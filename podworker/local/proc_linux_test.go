//go:build linux

package local

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want procStat
		ok   bool
	}{
		{"plain", "1 (init) S 0 1 1 0 -1 4194560 1 2 0 0 4 2 3 2 20 0 1 0 42 48459776 2920 18446744073709551615", procStat{'S', 1, 42}, true},
		{"comm with parens and spaces", "77 (a) (b c) Z 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0", procStat{'Z', 77, 999}, true},
		{"short", "1 (x) S 0 1", procStat{}, false},
		{"no comm", "1 x S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0", procStat{}, false},
		{"bad start", "1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 -4 0", procStat{}, false},
		{"bad pgrp", "1 (x) S 0 y 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4 0", procStat{}, false},
		{"empty", "", procStat{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat([]byte(tt.in))
			assert.Equal(t, tt.want, got)
			if tt.ok {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, errBadStat)
			}
		})
	}
}

func TestReadStatSelf(t *testing.T) {
	st, err := readStat(os.Getpid())
	require.NoError(t, err)
	assert.False(t, st.exited(), "readStat(self) = %+v", st)
	assert.NotZero(t, st.start, "readStat(self) = %+v", st)
	ref := procRef{pid: os.Getpid(), pgid: os.Getpid(), start: st.start}
	assert.True(t, ref.alive(), "alive(self)")
	ref.start++
	assert.False(t, ref.alive(), "alive(self with another start time)")
}

// FuzzParseStat: whatever a process names itself (the command may hold spaces and
// parentheses), a stat line parses back to the state, process group and start time it
// carries; bytes that are no stat line are errBadStat and yield nothing.
func FuzzParseStat(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 2 0 0 4 2 3 2 20 0 1 0 42 48459776 2920"), "init", byte('S'), 1, uint64(42))
	f.Add([]byte("77 (a) (b c) Z 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0"), "a) (b c", byte('Z'), 77, uint64(999))
	f.Add([]byte(")"), ") R 1 (", byte('R'), -1, uint64(0))
	f.Add([]byte("0 (0) \x89"), "0", byte(0x89), 1, uint64(42))
	f.Fuzz(func(t *testing.T, b []byte, comm string, state byte, pgrp int, start uint64) {
		st, err := parseStat(b)
		if err != nil {
			require.ErrorIs(t, err, errBadStat)
			assert.Zero(t, st, "parseStat(%q) failed but returned fields", b)
		} else {
			// The state is the one byte after the command's closing parenthesis.
			rest := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
			assert.Equal(t, []byte{st.state}, rest[0])
		}

		// Round trip: a line the kernel would write for these values.
		if bytes.ContainsAny([]byte{state}, " \t\n\v\f\r)") {
			return
		}
		line := fmt.Sprintf("4242 (%s) %s 1 %d %d 0 -1 4194560 1 2 0 0 4 2 3 2 20 0 1 0 %d 48459776 2920\n", comm, []byte{state}, pgrp, pgrp, start)
		st, err = parseStat([]byte(line))
		require.NoError(t, err, "%q", line)
		assert.Equal(t, procStat{state: state, pgrp: pgrp, start: start}, st, "%q", line)
	})
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
