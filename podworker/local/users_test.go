package local

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestIDsMapped(t *testing.T) {
	tests := []struct {
		name, uidMap string
		first, count uint32
		want, err    bool
	}{
		{"whole space", "0 0 4294967295\n", 2_000_000_000, 65536, true, false},
		{"rootless container", "0 1000 1\n1 100000 65536\n", 10_000, 100, true, false},
		{"outside the mapped ids", "0 1000 1\n1 100000 65536\n", 2_000_000_000, 16, false, false},
		{"over the end of an extent", "0 0 1000\n", 990, 20, false, false},
		{"across two extents", "0 0 1000\n1000 5000 1000\n", 990, 20, true, false},
		{"only uid 0", "0 1000 1\n", 1, 1, false, false},
		{"malformed", "0 0\n", 1, 1, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "uid_map")
			require.NoError(t, os.WriteFile(p, []byte(tt.uidMap), 0o600))
			got, err := idsMapped(p, tt.first, tt.count)
			if tt.err {
				assert.Error(t, err, "idsMapped(%q, %d, %d)", tt.uidMap, tt.first, tt.count)
			} else {
				assert.NoError(t, err, "idsMapped(%q, %d, %d)", tt.uidMap, tt.first, tt.count)
			}
			assert.Equal(t, tt.want, got, "idsMapped(%q, %d, %d)", tt.uidMap, tt.first, tt.count)
		})
	}
}
