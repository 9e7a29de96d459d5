package vmworker

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dynrunner/dynrunner/internal/assignment"
	"github.com/dynrunner/dynrunner/internal/sealbox"
)

// Errors of Redeem. The endpoint maps them to HTTP statuses.
var (
	// ErrUnknownNonce: no such nonce, or not for this instance.
	ErrUnknownNonce = errors.New("vmworker: unknown nonce")
	// ErrNonceRedeemed: the nonce was redeemed before.
	ErrNonceRedeemed = errors.New("vmworker: nonce already redeemed")
)

// Nonces issues and redeems single-use nonces; redemption is decided by a compare-and-swap in
// JetStream, so it holds across controller replicas and restarts.
type Nonces struct {
	kv  jetstream.KeyValue
	box *sealbox.Box
}

type nonceRecord struct {
	Task       assignment.TaskID `json:"task_id"`
	Epoch      assignment.Epoch  `json:"epoch"`
	InstanceID string            `json:"instance_id"`
	Token      string            `json:"token,omitempty"`
	Redeemed   bool              `json:"redeemed"`
	Issued     time.Time         `json:"issued"`
}

// NewNonces returns Nonces keeping one record per nonce, sealed with box, in kv: the event
// log's eventlog.BucketNonces (eventlog.Log.Nonces), whose records expire after
// eventlog.Config.NoncesTTL, unredeemed nonces included.
func NewNonces(kv jetstream.KeyValue, box *sealbox.Box) *Nonces {
	return &Nonces{kv: kv, box: box}
}

func nonceKey(nonce string) string {
	s := sha256.Sum256([]byte(nonce))
	return hex.EncodeToString(s[:])
}

// NewNonce returns a fresh URL-safe nonce (256 bits).
func NewNonce() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("vmworker: nonce: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// Issue records nonce as redeemable once by instanceID for the capability token.
func (n *Nonces) Issue(ctx context.Context, nonce, instanceID string, task assignment.TaskID, epoch assignment.Epoch, token string) error {
	rec := nonceRecord{Task: task, Epoch: epoch, InstanceID: instanceID, Token: token, Issued: time.Now().UTC()}
	sealed, err := n.seal(nonce, rec)
	if err != nil {
		return err
	}
	if _, err := n.kv.Create(ctx, nonceKey(nonce), sealed); err != nil {
		return fmt.Errorf("vmworker: issue nonce for task %d: %w", task, err)
	}
	return nil
}

// Peek returns the assignment a nonce was issued for, without redeeming it.
func (n *Nonces) Peek(ctx context.Context, instanceID, nonce string) (assignment.TaskID, assignment.Epoch, error) {
	rec, _, err := n.read(ctx, instanceID, nonce)
	return rec.Task, rec.Epoch, err
}

func (n *Nonces) read(ctx context.Context, instanceID, nonce string) (nonceRecord, uint64, error) {
	key := nonceKey(nonce)
	e, err := n.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nonceRecord{}, 0, ErrUnknownNonce
	}
	if err != nil {
		return nonceRecord{}, 0, fmt.Errorf("vmworker: redeem: %w", err)
	}
	var rec nonceRecord
	plain, err := n.box.Open(e.Value(), nonceAAD(key))
	if err == nil {
		err = json.Unmarshal(plain, &rec)
	}
	if err != nil {
		return nonceRecord{}, 0, fmt.Errorf("vmworker: redeem: %w", err)
	}
	if rec.InstanceID != instanceID {
		return nonceRecord{}, 0, ErrUnknownNonce
	}
	if rec.Redeemed {
		return nonceRecord{}, 0, ErrNonceRedeemed
	}
	return rec, e.Revision(), nil
}

// Redeem trades a nonce for its token, once.
func (n *Nonces) Redeem(ctx context.Context, instanceID, nonce string) (assignment.TaskID, assignment.Epoch, string, error) {
	key := nonceKey(nonce)
	rec, rev, err := n.read(ctx, instanceID, nonce)
	if err != nil {
		return 0, 0, "", err
	}
	token := rec.Token
	rec.Token, rec.Redeemed = "", true
	sealed, err := n.seal(nonce, rec)
	if err != nil {
		return 0, 0, "", err
	}
	if _, err := n.kv.Update(ctx, key, sealed, rev); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return 0, 0, "", ErrNonceRedeemed // another redemption won the race
		}
		return 0, 0, "", fmt.Errorf("vmworker: redeem: %w", err)
	}
	return rec.Task, rec.Epoch, token, nil
}

func nonceAAD(key string) []byte { return []byte("dynrunner/nonce/" + key) }

func (n *Nonces) seal(nonce string, rec nonceRecord) ([]byte, error) {
	plain, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("vmworker: nonce record: %w", err)
	}
	return n.box.Seal(plain, nonceAAD(nonceKey(nonce)))
}
