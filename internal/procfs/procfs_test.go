//go:build linux

package procfs

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Stat
		ok   bool
	}{
		{"plain", "1 (init) S 0 1 1 0 -1 4194560 1 2 0 0 4 2 3 2 20 0 1 0 42 48459776 2920 18446744073709551615", Stat{"init", 'S', 1, 42}, true},
		{"comm with parentheses and spaces", "77 (a) (b c) Z 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0", Stat{"a) (b c", 'Z', 77, 999}, true},
		{"comm that looks like fields", "5 (x) R 1 2 3 (y) S 0 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 7 0 0", Stat{"x) R 1 2 3 (y", 'S', 9, 7}, true},
		{"empty comm", "6 () D 1 6 6 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 8 0 0", Stat{"", 'D', 6, 8}, true},
		{"dead, old kernels", "8 (q) x 1 8 8 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 3 0 0", Stat{"q", 'x', 8, 3}, true},
		{"short", "1 (x) S 0 1", Stat{}, false},
		{"no comm", "1 x S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0", Stat{}, false},
		{"no opening parenthesis", "1 x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0", Stat{}, false},
		{"state of two bytes", "1 (x) SS 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0", Stat{}, false},
		{"bad start", "1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 -4 0", Stat{}, false},
		{"bad pgrp", "1 (x) S 0 y 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4 0", Stat{}, false},
		{"empty", "", Stat{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseStat([]byte(tt.in))
			assert.Equal(t, tt.want, got)
			if tt.ok {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, ErrBadStat)
			}
		})
	}
}

func TestExited(t *testing.T) {
	for state, want := range map[byte]bool{'R': false, 'S': false, 'D': false, 'T': false, 't': false, 'I': false, 'Z': true, 'X': true, 'x': true} {
		assert.Equal(t, want, Stat{State: state}.Exited(), "state %c", state)
	}
}

// FuzzParseStat: whatever a process names itself (the command may hold spaces and
// parentheses), a stat line parses back to the command, state, process group and start time it
// carries; bytes that are no stat line are ErrBadStat and yield nothing.
func FuzzParseStat(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 2 0 0 4 2 3 2 20 0 1 0 42 48459776 2920"), "init", byte('S'), 1, uint64(42))
	f.Add([]byte("77 (a) (b c) Z 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0"), "a) (b c", byte('Z'), 77, uint64(999))
	f.Add([]byte(")"), ") R 1 (", byte('R'), -1, uint64(0))
	f.Add([]byte("0 (0) \x89"), "0", byte(0x89), 1, uint64(42))
	f.Fuzz(func(t *testing.T, b []byte, comm string, state byte, pgrp int, start uint64) {
		st, err := ParseStat(b)
		if err != nil {
			require.ErrorIs(t, err, ErrBadStat)
			assert.Zero(t, st, "ParseStat(%q) failed but returned fields", b)
		} else {
			// The state is the one byte after the command's closing parenthesis.
			rest := bytes.Fields(b[bytes.LastIndexByte(b, ')')+1:])
			assert.Equal(t, []byte{st.State}, rest[0])
		}

		// Round trip: a line the kernel would write for these values.
		if bytes.ContainsAny([]byte{state}, " \t\n\v\f\r)") {
			return
		}
		line := fmt.Sprintf("4242 (%s) %s 1 %d %d 0 -1 4194560 1 2 0 0 4 2 3 2 20 0 1 0 %d 48459776 2920\n", comm, []byte{state}, pgrp, pgrp, start)
		st, err = ParseStat([]byte(line))
		require.NoError(t, err, "%q", line)
		assert.Equal(t, Stat{Comm: comm, State: state, Pgrp: pgrp, Start: start}, st, "%q", line)
	})
}

func TestReadSelf(t *testing.T) {
	self := os.Getpid()
	st, err := ReadStat(self)
	require.NoError(t, err)
	assert.False(t, st.Exited(), "ReadStat(self) = %+v", st)
	assert.NotZero(t, st.Start, "ReadStat(self) = %+v", st)

	procs, err := Running()
	require.NoError(t, err)
	i := slices.IndexFunc(procs, func(p Proc) bool { return p.PID == self })
	require.GreaterOrEqual(t, i, 0, "Running() does not list this process")
	assert.Equal(t, st.Start, procs[i].Start)
	assert.Equal(t, st.Comm, procs[i].Comm)

	args, err := Cmdline(self)
	require.NoError(t, err)
	assert.Equal(t, os.Args, args)

	env, err := Environ(self)
	require.NoError(t, err)
	assert.NotContains(t, env, "", "an empty entry after the last NUL")

	ids, err := UIDs(self)
	require.NoError(t, err)
	assert.Equal(t, [4]uint32{uint32(os.Getuid()), uint32(os.Geteuid()), uint32(os.Geteuid()), uint32(os.Geteuid())}, ids)
}
