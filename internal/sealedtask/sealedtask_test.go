package sealedtask_test

import (
	"testing"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dynrunner/dynrunner/internal/sealbox"
	"github.com/dynrunner/dynrunner/internal/sealedtask"
)

// TestSealOpen: a sealed task opens as itself for its id and digest; the sealed task of
// another assignment, or bytes that are not the ones the claim recorded, do not open.
func TestSealOpen(t *testing.T) {
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	task := &runnerv1.Task{Id: 42, Secrets: map[string]string{"API_KEY": "s3cr3t"}}
	sealed, digest, err := sealedtask.Seal(box, 42, task)
	require.NoError(t, err)
	assert.NotContains(t, string(sealed), "s3cr3t")

	got, err := sealedtask.Open(box, 42, sealed, digest)
	require.NoError(t, err)
	assert.Equal(t, "s3cr3t", got.GetSecrets()["API_KEY"])

	_, err = sealedtask.Open(box, 43, sealed, digest)
	require.ErrorIs(t, err, sealbox.ErrOpen, "task 42's sealed task opened as task 43's")

	other, otherDigest, err := sealedtask.Seal(box, 42, &runnerv1.Task{Id: 42})
	require.NoError(t, err)
	_, err = sealedtask.Open(box, 42, other, digest)
	require.Error(t, err, "a sealed task other than the one recorded at the claim opened")
	_, err = sealedtask.Open(box, 42, sealed, otherDigest)
	require.Error(t, err)
}

// TestSealOpenJIT: a slot's JIT configuration opens for its slot and digest only, and never as
// a task (nor a task as a JIT configuration).
func TestSealOpenJIT(t *testing.T) {
	box, err := sealbox.New([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	sealed, digest, err := sealedtask.SealJIT(box, 7, "eyJqaXQiOiJzM2NyM3QifQ==")
	require.NoError(t, err)
	assert.NotContains(t, string(sealed), "eyJqaXQi")
	assert.Equal(t, digest, sealedtask.Digest(sealed))
	got, err := sealedtask.OpenJIT(box, 7, sealed, digest)
	require.NoError(t, err)
	assert.Equal(t, "eyJqaXQiOiJzM2NyM3QifQ==", got)

	_, err = sealedtask.OpenJIT(box, 8, sealed, digest)
	require.ErrorIs(t, err, sealbox.ErrOpen, "slot 7's configuration opened as slot 8's")
	_, err = sealedtask.Open(box, 7, sealed, digest)
	require.ErrorIs(t, err, sealbox.ErrOpen, "a JIT configuration opened as a task")
	task, taskDigest, err := sealedtask.Seal(box, 7, &runnerv1.Task{Id: 7})
	require.NoError(t, err)
	_, err = sealedtask.OpenJIT(box, 7, task, taskDigest)
	require.ErrorIs(t, err, sealbox.ErrOpen, "a task opened as a JIT configuration")
	_, err = sealedtask.OpenJIT(box, 7, sealed, taskDigest)
	require.Error(t, err, "a configuration other than the recorded one opened")
	_, _, err = sealedtask.SealJIT(box, 7, "")
	require.Error(t, err)
}
