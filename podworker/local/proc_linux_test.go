//go:build linux

package local

import (
	"os"
	"testing"

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
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("parseStat(%q) = %+v, %v; want %+v, ok %v", tt.in, got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestReadStatSelf(t *testing.T) {
	st, err := readStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.exited() || st.start == 0 {
		t.Errorf("readStat(self) = %+v", st)
	}
	ref := procRef{pid: os.Getpid(), pgid: os.Getpid(), start: st.start}
	if !ref.alive() {
		t.Error("alive(self) = false")
	}
	ref.start++
	if ref.alive() {
		t.Error("alive(self with another start time) = true")
	}
}

func FuzzParseStat(f *testing.F) {
	f.Add([]byte("1 (init) S 0 1 1 0 -1 4194560 1 2 0 0 4 2 3 2 20 0 1 0 42 48459776 2920"))
	f.Add([]byte("77 (a) (b c) Z 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 999 0 0"))
	f.Add([]byte(")"))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := parseStat(b)
		if err != nil && st != (procStat{}) {
			t.Errorf("parseStat(%q) = %+v with error %v", b, st, err)
		}
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
		if task != tt.task || epoch != tt.epoch || ok != tt.ok {
			t.Errorf("parseEnvID(%q) = %d, %d, %v; want %d, %d, %v", tt.id, task, epoch, ok, tt.task, tt.epoch, tt.ok)
		}
		if ok && envID(task, epoch) != tt.id {
			t.Errorf("envID(%d, %d) = %q, want %q", task, epoch, envID(task, epoch), tt.id)
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
		if envID(task, epoch) != id {
			t.Errorf("parseEnvID(%q) = %d, %d; envID gives %q", id, task, epoch, envID(task, epoch))
		}
		if !validName(id, false) {
			t.Errorf("environment id %q is not a valid name", id)
		}
	})
}

func TestValidName(t *testing.T) {
	for name, want := range map[string]bool{
		"token": true, "svid.pem": true, ".hidden": false, "": false, ".": false, "..": false,
		"a/b": false, "a..b": false, "nul\x00": false, string(make([]byte, 256)): false,
	} {
		if got := validName(name, false); got != want {
			t.Errorf("validName(%q) = %v, want %v", name, got, want)
		}
	}
	if !validName(".hidden", true) {
		t.Error(`validName(".hidden", dots) = false`)
	}
}

func TestRefFromData(t *testing.T) {
	ref := procRef{pid: 10, pgid: 10, start: 99}
	got, ok, err := refFromData(ref.data("/x"))
	if err != nil || !ok || got != ref {
		t.Errorf("refFromData(data(%+v)) = %+v, %v, %v", ref, got, ok, err)
	}
	if _, ok, err := refFromData(nil); ok || err != nil {
		t.Errorf("refFromData(nil) = %v, %v; want no process, no error", ok, err)
	}
	for _, d := range []map[string]string{
		{dataPID: "1", dataPGID: "1", dataStartTime: "5"},
		{dataPID: "10", dataPGID: "11", dataStartTime: "5"},
		{dataPID: "10", dataPGID: "10"},
		{dataPID: "ten", dataPGID: "10", dataStartTime: "5"},
	} {
		if _, _, err := refFromData(d); err == nil {
			t.Errorf("refFromData(%v) succeeded", d)
		}
	}
}
