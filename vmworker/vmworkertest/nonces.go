package vmworkertest

import (
	"context"
	"fmt"
	"sync"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/vmworker"
)

// Nonces is an in-memory nonce store with the semantics of vmworker.Nonces: a nonce redeems
// once, for the instance it was issued to.
type Nonces struct {
	mu     sync.Mutex
	issued map[string]*nonceRecord
	err    error
}

type nonceRecord struct {
	task     assignment.TaskID
	epoch    assignment.Epoch
	instance string
	token    string
	redeemed bool
}

// NewNonces returns an empty store.
func NewNonces() *Nonces { return &Nonces{issued: map[string]*nonceRecord{}} }

// Issue records nonce as redeemable once by instanceID for token.
func (n *Nonces) Issue(_ context.Context, nonce, instanceID string, task assignment.TaskID, epoch assignment.Epoch, token string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.err != nil {
		return n.err
	}
	if _, dup := n.issued[nonce]; dup {
		return fmt.Errorf("vmworkertest: nonce issued twice")
	}
	n.issued[nonce] = &nonceRecord{task: task, epoch: epoch, instance: instanceID, token: token}
	return nil
}

// Redeem trades a nonce for its token, once.
func (n *Nonces) Redeem(instanceID, nonce string) (assignment.TaskID, assignment.Epoch, string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	rec, ok := n.issued[nonce]
	if !ok || rec.instance != instanceID {
		return 0, 0, "", vmworker.ErrUnknownNonce
	}
	if rec.redeemed {
		return 0, 0, "", vmworker.ErrNonceRedeemed
	}
	rec.redeemed = true
	token := rec.token
	rec.token = ""
	return rec.task, rec.epoch, token, nil
}

// Len returns how many nonces were issued.
func (n *Nonces) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.issued)
}

// SetError makes Issue fail with err (nil restores it).
func (n *Nonces) SetError(err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.err = err
}
