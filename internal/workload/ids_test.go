package workload

import (
	"math"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/assignment"
)

var (
	testTD  = spiffeid.RequireTrustDomainFromString("ci.example.org")
	otherTD = spiffeid.RequireTrustDomainFromString("other.example.org")
)

func TestAssignmentID(t *testing.T) {
	tests := []struct {
		name  string
		td    spiffeid.TrustDomain
		task  assignment.TaskID
		epoch assignment.Epoch
		want  string // "" is the zero ID
	}{
		{name: "assignment", td: testTD, task: 42, epoch: 7, want: "spiffe://ci.example.org/dynrunner/task/42/epoch/7"},
		{name: "largest", td: testTD, task: math.MaxInt64, epoch: math.MaxUint64,
			want: "spiffe://ci.example.org/dynrunner/task/9223372036854775807/epoch/18446744073709551615"},
		{name: "zero trust domain", td: spiffeid.TrustDomain{}, task: 1, epoch: 1},
		{name: "zero task", td: testTD, task: 0, epoch: 1},
		{name: "negative task", td: testTD, task: -1, epoch: 1},
		{name: "zero epoch", td: testTD, task: 1, epoch: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := AssignmentID(tt.td, tt.task, tt.epoch)
			if tt.want == "" {
				require.True(t, got.IsZero(), "AssignmentID() = %s, want the zero ID", got)
				return
			}
			require.Equal(t, tt.want, got.String(), "AssignmentID() = %s, want %s", got, tt.want)
			task, epoch, err := ParseAssignmentID(got, tt.td)
			if assert.NoError(t, err, "ParseAssignmentID(AssignmentID())") {
				assert.Equal(t, tt.task, task, "ParseAssignmentID(AssignmentID()) task")
				assert.Equal(t, tt.epoch, epoch, "ParseAssignmentID(AssignmentID()) epoch")
			}
		})
	}
}

func TestFacadeID(t *testing.T) {
	assert.Equal(t, "spiffe://ci.example.org/dynrunner/facade", FacadeID(testTD).String(), "FacadeID()")
	got := FacadeID(spiffeid.TrustDomain{})
	assert.True(t, got.IsZero(), "FacadeID(zero) = %s, want the zero ID", got)
	_, _, err := ParseAssignmentID(FacadeID(testTD), testTD)
	assert.ErrorIs(t, err, ErrNotAssignment, "ParseAssignmentID(FacadeID) error")
}

func TestParseAssignmentID(t *testing.T) {
	tests := []struct {
		name      string
		id        string
		td        spiffeid.TrustDomain
		wantTask  assignment.TaskID
		wantEpoch assignment.Epoch
		wantErr   error
	}{
		{name: "assignment", id: "spiffe://ci.example.org/dynrunner/task/42/epoch/7", td: testTD, wantTask: 42, wantEpoch: 7},
		{name: "other trust domain", id: "spiffe://other.example.org/dynrunner/task/42/epoch/7", td: testTD, wantErr: ErrNotAssignment},
		{name: "zero trust domain", id: "spiffe://ci.example.org/dynrunner/task/42/epoch/7", td: spiffeid.TrustDomain{}, wantErr: ErrNotAssignment},
		{name: "trust domain only", id: "spiffe://ci.example.org", td: testTD, wantErr: ErrNotAssignment},
		{name: "facade", id: "spiffe://ci.example.org/dynrunner/facade", td: testTD, wantErr: ErrNotAssignment},
		{name: "no epoch", id: "spiffe://ci.example.org/dynrunner/task/42", td: testTD, wantErr: ErrNotAssignment},
		{name: "extra segment", id: "spiffe://ci.example.org/dynrunner/task/42/epoch/7/x", td: testTD, wantErr: ErrNotAssignment},
		{name: "prefixed path", id: "spiffe://ci.example.org/x/dynrunner/task/42/epoch/7", td: testTD, wantErr: ErrNotAssignment},
		{name: "other root", id: "spiffe://ci.example.org/dynrunnerx/task/42/epoch/7", td: testTD, wantErr: ErrNotAssignment},
		{name: "swapped names", id: "spiffe://ci.example.org/dynrunner/epoch/42/task/7", td: testTD, wantErr: ErrNotAssignment},
		{name: "upper case", id: "spiffe://ci.example.org/dynrunner/TASK/42/epoch/7", td: testTD, wantErr: ErrNotAssignment},
		{name: "leading zero task", id: "spiffe://ci.example.org/dynrunner/task/042/epoch/7", td: testTD, wantErr: ErrNotAssignment},
		{name: "leading zero epoch", id: "spiffe://ci.example.org/dynrunner/task/42/epoch/07", td: testTD, wantErr: ErrNotAssignment},
		{name: "zero task", id: "spiffe://ci.example.org/dynrunner/task/0/epoch/7", td: testTD, wantErr: ErrNotAssignment},
		{name: "zero epoch", id: "spiffe://ci.example.org/dynrunner/task/42/epoch/0", td: testTD, wantErr: ErrNotAssignment},
		{name: "negative task", id: "spiffe://ci.example.org/dynrunner/task/-42/epoch/7", td: testTD, wantErr: ErrNotAssignment},
		{name: "task overflow", id: "spiffe://ci.example.org/dynrunner/task/9223372036854775808/epoch/7", td: testTD, wantErr: ErrNotAssignment},
		{name: "epoch overflow", id: "spiffe://ci.example.org/dynrunner/task/42/epoch/18446744073709551616", td: testTD, wantErr: ErrNotAssignment},
		{name: "hex task", id: "spiffe://ci.example.org/dynrunner/task/0x2a/epoch/7", td: testTD, wantErr: ErrNotAssignment},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := spiffeid.RequireFromString(tt.id)
			task, epoch, err := ParseAssignmentID(id, tt.td)
			require.ErrorIs(t, err, tt.wantErr, "ParseAssignmentID()")
			assert.Equal(t, tt.wantTask, task, "ParseAssignmentID() task")
			assert.Equal(t, tt.wantEpoch, epoch, "ParseAssignmentID() epoch")
		})
	}
	t.Run("zero id", func(t *testing.T) {
		_, _, err := ParseAssignmentID(spiffeid.ID{}, testTD)
		require.ErrorIs(t, err, ErrNotAssignment, "ParseAssignmentID(zero) error")
	})
}

func FuzzParseAssignmentID(f *testing.F) {
	f.Add("spiffe://ci.example.org/dynrunner/task/42/epoch/7")
	f.Add("spiffe://ci.example.org/dynrunner/facade")
	f.Add("spiffe://other.example.org/dynrunner/task/1/epoch/1")
	f.Add("spiffe://ci.example.org/dynrunner/task/01/epoch/1")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := spiffeid.FromString(s)
		if err != nil {
			return
		}
		task, epoch, err := ParseAssignmentID(id, testTD)
		if err != nil {
			require.ErrorIs(t, err, ErrNotAssignment, "ParseAssignmentID(%q) error = %v, want ErrNotAssignment", s, err)
			return
		}
		// Only the canonical form parses, so it round-trips exactly.
		require.Equal(t, id, AssignmentID(testTD, task, epoch), "ParseAssignmentID(%q) = %d, %d, but AssignmentID of that is %s", s, task, epoch, AssignmentID(testTD, task, epoch))
	})
}
