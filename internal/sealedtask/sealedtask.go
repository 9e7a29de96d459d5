package sealedtask

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/proto"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/sealbox"
)

// AAD binds a sealed task to its id.
func AAD(id assignment.TaskID) []byte { return []byte("dynrunner/task/" + id.String()) }

// Seal seals task for id and returns the sealed bytes and their digest, which the claim
// records (assignment.Record.TaskDigest).
func Seal(box *sealbox.Box, id assignment.TaskID, task *runnerv1.Task) (sealed []byte, digest string, err error) {
	sealed, err = box.Seal(mustMarshal(task), AAD(id))
	if err != nil {
		return nil, "", err
	}
	return sealed, digestOf(sealed), nil
}

// digestOf is the digest of a sealed task as the claim records it: hex SHA-256.
func digestOf(sealed []byte) string {
	sum := sha256.Sum256(sealed)
	return hex.EncodeToString(sum[:])
}

// Open unseals a stored task and checks it against the digest recorded at the claim.
func Open(box *sealbox.Box, id assignment.TaskID, sealed []byte, digest string) (*runnerv1.Task, error) {
	if digestOf(sealed) != digest {
		return nil, fmt.Errorf("sealedtask: sealed task %d does not match the digest recorded at its claim", id)
	}
	plain, err := box.Open(sealed, AAD(id))
	if err != nil {
		return nil, fmt.Errorf("sealedtask: open task %d: %w", id, err)
	}
	var t runnerv1.Task
	if err := proto.Unmarshal(plain, &t); err != nil {
		return nil, fmt.Errorf("sealedtask: decode task %d: %w", id, err)
	}
	return &t, nil
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err) // a message received from the wire always marshals
	}
	return b
}

// jitAAD binds a GitHub slot's sealed JIT runner configuration to the slot's id; it differs from
// a task's, so one is never opened as the other.
func jitAAD(id assignment.TaskID) []byte { return []byte("dynrunner/github-jit/" + id.String()) }

// SealJIT seals a GitHub slot's JIT runner configuration (the runner's only credential) for
// slot id, like a Gitea task: it is stored in the tasks bucket, and `configured` records its
// digest.
func SealJIT(box *sealbox.Box, id assignment.TaskID, jitConfig string) (sealed []byte, digest string, err error) {
	if jitConfig == "" {
		return nil, "", fmt.Errorf("sealedtask: slot %d: empty JIT configuration", id)
	}
	sealed, err = box.Seal([]byte(jitConfig), jitAAD(id))
	if err != nil {
		return nil, "", err
	}
	return sealed, digestOf(sealed), nil
}

// OpenJIT unseals a slot's JIT configuration and checks it against the digest `configured`
// recorded.
func OpenJIT(box *sealbox.Box, id assignment.TaskID, sealed []byte, digest string) (string, error) {
	if digestOf(sealed) != digest {
		return "", fmt.Errorf("sealedtask: the sealed JIT configuration of slot %d does not match the digest recorded when it was configured", id)
	}
	plain, err := box.Open(sealed, jitAAD(id))
	if err != nil {
		return "", fmt.Errorf("sealedtask: open the JIT configuration of slot %d: %w", id, err)
	}
	return string(plain), nil
}

// Digest is the digest of sealed bytes as the records keep it (hex SHA-256).
func Digest(sealed []byte) string { return digestOf(sealed) }
